"""The PyTorch-style layer over the native autograd: ``checkpoint`` and ``checkpoint_sequential``
(:mod:`riftco.autograd.checkpointing`), their automatic dependency discovery
(:mod:`riftco.autograd.discovery`) and grad mode (``no_grad``, ``enable_grad``,
``set_grad_enabled``: :mod:`riftco.autograd.grad_mode`). The modules ``riftco.nn``, the
optimizers ``riftco.optim`` and the ops ``riftco.functional`` belong to the same layer.

The layer imports only ``riftco._native`` and its own modules, never the data or training wings
(see docs/architecture.md).
"""
