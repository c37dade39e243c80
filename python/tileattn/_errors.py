"""The exception the Python layers raise for a bad argument: tileattn.InvalidArgument (a
ValueError) naming it in ``parameter``, as the extension's own."""
from . import _C


def invalid(parameter: str, reason: str) -> "_C.InvalidArgument":
    """``tileattn.InvalidArgument("tileattn: <parameter>: <reason>")`` with ``parameter`` set."""
    e = _C.InvalidArgument(f"tileattn: {parameter}: {reason}")
    e.parameter = parameter
    return e
