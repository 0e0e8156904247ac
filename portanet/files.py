"""The rules every file portanet reads or writes follows, in one place.

    parse_json(text, what)      JSON with its nesting bounded before it is parsed

A leaf module: it imports nothing of portanet's but errors, so the backends may use it.
"""
import json
import re

import numpy as np

from .errors import PortanetError

# Deeper than any file portanet writes (a checkpoint's metadata is 4 levels, a routes file
# 2, a tuning database 5), far below where Python's json recursion fails (~1000).
MAX_JSON_DEPTH = 64

_STRING = re.compile(rb'"(?:[^"\\]|\\.)*"', re.S)


def json_depth(text):
    """The deepest nesting of [ and { in JSON text (str or bytes), strings skipped."""
    raw = text.encode("utf-8", "surrogatepass") if isinstance(text, str) else bytes(text)
    codes = np.frombuffer(_STRING.sub(b'""', raw), dtype=np.uint8)
    steps = (np.isin(codes, (ord("["), ord("{"))).astype(np.int64)
             - np.isin(codes, (ord("]"), ord("}"))))
    return int(np.cumsum(steps).max(initial=0))


def parse_json(text, what, error=PortanetError, max_depth=MAX_JSON_DEPTH):
    """json.loads(text), refusing text nested deeper than max_depth (before parsing it:
    Python's parser recurses) or that is not JSON, with `error` naming `what`."""
    depth = json_depth(text)
    if depth > max_depth:
        raise error(f"{what} is nested {depth} levels deep, more than the {max_depth} "
                    f"portanet reads: it is damaged or not one of portanet's files")
    try:
        return json.loads(text)
    except (ValueError, RecursionError) as e:
        raise error(f"{what} is not valid JSON ({e}): it is damaged or not one of "
                    f"portanet's files") from e
