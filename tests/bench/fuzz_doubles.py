"""A command line for the fuzz harness's own tests, which the harness's fresh process imports:
``probe`` dies in a traceback, ``ask`` runs past any time limit."""

import time


def main(argv: list[str]) -> int:
    if argv[0] == "probe":
        raise ZeroDivisionError("float division by zero")
    time.sleep(30)
    return 0
