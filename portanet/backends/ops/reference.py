"""What the NumPy references share."""
import functools

import numpy as np


def quiet(method):
    """Arithmetic as a GPU does it: overflow gives inf, inf - inf NaN, without NumPy's
    warnings; a diverged run is reported once, by fit's DivergedError."""
    @functools.wraps(method)
    def quiet(*args, **kwargs):
        with np.errstate(over="ignore", invalid="ignore", divide="ignore"):
            return method(*args, **kwargs)
    return quiet
