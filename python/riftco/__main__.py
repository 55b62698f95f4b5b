"""``python -m riftco``: the ``riftco`` command (see :mod:`riftco.commands`)."""

from riftco.commands import main

if __name__ == "__main__":
    main()
