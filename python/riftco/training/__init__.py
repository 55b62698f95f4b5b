"""The training wing: how a model is trained and what a run leaves behind.

- :mod:`riftco.training.configs`: ``PretrainingConfig`` and ``PostTrainingConfig``;
- :mod:`riftco.training.stages`: ``run_pretraining``, ``run_post_training``, ``load_model``;
- :mod:`riftco.training.loop`: the loop the stages share, in phases (set up, step, evaluate,
  checkpoint, finish);
- :mod:`riftco.training.state`: training-state checkpoints and resume;
- :mod:`riftco.training.run_folder` and :mod:`riftco.training.run_records`: a run's folder and
  its per-step records; :mod:`riftco.training.plotting`: ``loss.png`` and ``memory.png``;
- :mod:`riftco.training.distributed`: data-parallel training over MPI (ZeRO 1 and 2).

The training wing imports the data wing, the PyTorch-style layer and ``riftco._native``, never
the commands (see docs/architecture.md).
"""
