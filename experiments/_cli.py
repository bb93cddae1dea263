"""What every entry point does around its work: a quiet console, and one place to run it.

Library INFO logging (orbax's checkpoint chatter, jax's backend probing, absl) stays off the
console, so progress bars, tables and warnings are what a person sees; `--verbosity=0` (or
higher) brings INFO back for debugging.
"""

from absl import app, flags, logging


def quiet_logging() -> None:
    """Shows warnings and errors only, unless `--verbosity` was given on the command line."""
    if not flags.FLAGS["verbosity"].present:
        logging.set_verbosity(logging.WARNING)


def run(main) -> None:
    """`absl.app.run(main)` with `quiet_logging()` applied once the flags are parsed."""

    def quiet_main(argv):
        quiet_logging()
        return main(argv)

    app.run(quiet_main)
