"""Shared by the Python test drivers: pulls `--flag PATH` out of argv."""
import sys


def take_flag(argv, flag):
    """Removes `flag PATH` or `flag=PATH` from argv; returns PATH or None."""
    for i, a in enumerate(argv):
        if a == flag:
            if i + 1 >= len(argv):
                sys.exit("%s needs a path" % flag)
            value = argv[i + 1]
            del argv[i:i + 2]
            return value
        if a.startswith(flag + "="):
            del argv[i]
            return a[len(flag) + 1:]
    return None
