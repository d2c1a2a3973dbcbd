"""``python -m transient_nb.cli``: the ``transient-nb`` command."""

from transient_nb.cli import main

if __name__ == "__main__":
    raise SystemExit(main())
