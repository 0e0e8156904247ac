"""The rules every file portanet reads or writes follows, in one place.

    parse_json(text, what)                 JSON with its nesting bounded before it is parsed
    check_destination(path, what)          before long work: can `path` be written?
    write_atomically(path, save, what)     the one writer rule (below), save(tmp) writes
    write_text(path, text, what)           the same for text
    read_bytes(path, what, max_bytes)      a regular file's bytes; a FIFO or device refused

A leaf module: it imports nothing of portanet's but errors, so the backends may use it.
"""
import glob
import json
import os
import re
import shutil
import stat
import tempfile
import time
from pathlib import Path

import numpy as np

from .errors import PortanetError

# Deeper than any file portanet writes (a checkpoint's metadata is 4 levels, a routes file
# 3, a tuning database 5), far below where Python's json recursion fails (~1000).
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


# -- reading -------------------------------------------------------------------------


def read_bytes(path, what, error=PortanetError, max_bytes=None):
    """The bytes of the regular file at `path` (a symlink followed). Anything else is
    refused with `error` naming `what`, before it is opened where it can be told apart
    (a FIFO would block the read, /dev/zero never ends), as is a file over max_bytes.
    OSErrors (missing, unreadable) propagate as themselves: the caller knows what they
    mean for it."""
    info = os.stat(path)
    if stat.S_ISDIR(info.st_mode):
        raise error(f"cannot read {what} from {path}: it is a folder; give the path of a "
                    f"file")
    if not stat.S_ISREG(info.st_mode):
        raise error(f"cannot read {what} from {path}: it is {kind_of(info.st_mode)}, not a "
                    f"regular file; choose another path")
    flags = os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_NOCTTY", 0)
    fd = os.open(path, flags)
    with open(fd, "rb") as f:
        info = os.fstat(fd)              # the file opened, should path have changed since
        if not stat.S_ISREG(info.st_mode):
            raise error(f"cannot read {what} from {path}: it is {kind_of(info.st_mode)}, not a "
                        f"regular file; choose another path")
        if max_bytes is not None and info.st_size > max_bytes:     # refused unread
            raise error(f"cannot read {what} from {path}: it is larger than the {max_bytes} "
                        f"bytes such a file can be; it is not one of portanet's files")
        data = f.read() if max_bytes is None else f.read(max_bytes + 1)
    if max_bytes is not None and len(data) > max_bytes:    # grown since the fstat
        raise error(f"cannot read {what} from {path}: it is larger than the {max_bytes} "
                    f"bytes such a file can be; it is not one of portanet's files")
    return data


# -- writing -------------------------------------------------------------------------
#
# One rule for every file portanet writes (models, checkpoints, ONNX exports, plots, the
# routes file, the tuning database, bench reports): the destination is a regular file or
# absent, and anything else there (a folder, FIFO, device node, socket) is refused before
# a byte is written; a symlink is written through (the link stays, the file it names is
# replaced); the file's permissions (and, where allowed, its owner and group) are kept, a
# new file gets what open() gives under the umask; the new file is written beside the old
# one, fsynced, renamed over it and the folder fsynced, so that after a return, a failure
# or a kill at any moment the path holds the whole old file or the whole new one.

_KINDS = ((stat.S_ISFIFO, "a FIFO (named pipe)"), (stat.S_ISCHR, "a character device"),
          (stat.S_ISBLK, "a block device"), (stat.S_ISSOCK, "a socket"),
          (stat.S_ISDIR, "a folder"))


def check_destination(path, what, error=PortanetError):
    """The Path that writing `what` (words for messages: "the model", "the plot") to
    `path` will replace: path itself, or for a symlink the file it names. Checked now, so
    that a long computation is not lost at its end: raises `error` naming the path and the
    fix when the path is a folder or anything but a regular file, or its folder is missing,
    not a folder or not writable (probed with a file, removed again)."""
    target = _destination(path, what, error)
    os.remove(_temp_beside(target, path, what, error))
    return target


def write_atomically(path, save, what, error=PortanetError):
    """save(temp_path) writes the file, which then replaces `path` (see check_destination)
    atomically: after this returns, or fails, or the process is killed at any moment, the
    destination holds either the whole previous file or the whole new one, with the
    previous one's permissions. temp_path ends with the destination's name (a suffix that
    picks a format is kept). Raises `error` naming the path and the OS's reason for a bad
    destination, a full disk, a file-size limit; a PortanetError raised by save propagates
    as itself, and KeyboardInterrupt too, after the temp is removed. Returns the Path
    written (for a symlink, the file it names)."""
    target = _destination(path, what, error)
    # Written in a hidden temp folder beside the target: os.replace from it is a rename
    # within one file system (atomic), and a writer's own temp file (safetensors makes one
    # next to the path it is given, then renames it) lands in that folder too. So all a
    # SIGKILL or power loss can leave is one folder named after the target, which a later
    # write removes (_remove_stale_temps).
    _remove_stale_temps(target)
    work = _temp_beside(target, path, what, error, mkdir=True)
    tmp = os.path.join(work, target.name)
    try:
        save(tmp)
        _keep_owner_and_mode(tmp, target)
        # few writers fsync: without it a crash soon after the rename could leave an
        # empty file on some file systems
        fd = os.open(tmp, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
        _destination(path, what, error)      # still a regular file or absent
        os.replace(tmp, target)
    except BaseException as e:
        shutil.rmtree(work, ignore_errors=True)
        if not isinstance(e, Exception) or isinstance(e, PortanetError):
            raise            # Ctrl-C, SystemExit: the user's; our own errors say it already
        raise error(f"could not save {what} to {path}: {_reason(e)}; the previous file, "
                    f"if any, is unchanged. Free some disk space or choose another "
                    f"folder") from e
    shutil.rmtree(work, ignore_errors=True)
    _fsync_folder(target.parent)
    return target


def write_text(path, text, what, error=PortanetError):
    """write_atomically for text (UTF-8, written as given: end it with a newline)."""
    def save(tmp):
        with open(tmp, "w", encoding="utf-8") as f:
            f.write(text)
    return write_atomically(path, save, what, error)


def _destination(path, what, error):
    """The real target of `path` (symlinks followed), checked to be a regular file or
    absent in an existing folder."""
    shown = path
    path = Path(os.fspath(path))
    try:
        # Write through a symlink to the file it names, so that the link stays a link.
        target = Path(os.path.realpath(path)) if path.is_symlink() else path
        try:
            mode = os.stat(target).st_mode
        except FileNotFoundError:
            mode = None
        if str(shown).endswith(os.sep) or (mode is not None and stat.S_ISDIR(mode)):
            raise error(f"cannot save {what} to {shown}: it is a folder; give the name of a "
                        f"file in it")
        if mode is not None and not stat.S_ISREG(mode):
            raise error(f"cannot save {what} to {shown}: it is {kind_of(mode)}, not a regular "
                        f"file, and portanet replaces only regular files; choose another path")
        folder = target.parent
        if not folder.exists():
            raise error(f"cannot save {what} to {shown}: the folder {folder} does not "
                        f"exist; create it first (os.makedirs)")
        if not folder.is_dir():
            raise error(f"cannot save {what} to {shown}: {folder} is a file, not a folder")
    except OSError as e:          # a name too long, a folder we may not look into, a loop
        raise error(f"cannot save {what} to {shown}: {e.strerror or e}") from e
    return target


def kind_of(mode):
    """What os.stat's st_mode is when it is not a regular file ("a folder", "a FIFO (named
    pipe)", ...); None for a regular file."""
    if stat.S_ISREG(mode):
        return None
    return next((kind for test, kind in _KINDS if test(mode)), "a special file")


def _temp_beside(target, shown, what, error, mkdir=False):
    """A new hidden file, or folder, in the target's folder, named after the target."""
    try:
        if mkdir:
            return tempfile.mkdtemp(dir=target.parent, prefix=_temp_prefix(target),
                                    suffix=".tmp")
        fd, tmp = tempfile.mkstemp(dir=target.parent, prefix=_temp_prefix(target),
                                   suffix=".probe")
        os.close(fd)
        return tmp
    except OSError as e:
        raise error(f"cannot save {what} to {shown}: cannot create files in "
                    f"{target.parent} ({e.strerror or e}); choose a folder you can write "
                    f"to") from e


def _temp_prefix(target):
    return f".{target.name[:100]}."     # [:100]: room for the random part in 255 bytes


def _remove_stale_temps(target, age_s=3600):
    """Remove the temp folders of earlier writes of this target that were killed. One
    left untouched for an hour is no longer being written: a write in progress updates
    it."""
    cutoff = time.time() - age_s
    for old in target.parent.glob(glob.escape(_temp_prefix(target)) + "*.tmp"):
        try:
            if max(p.lstat().st_mtime for p in [old, *old.iterdir()]) < cutoff:
                shutil.rmtree(old)
        except OSError:      # gone already, not a folder, or not ours to remove: leave it
            pass


def _keep_owner_and_mode(tmp, target):
    """Give tmp the target's group (and owner, where we may) and permissions: a shared
    0664 file stays shared. A new file gets what open() gives (mkstemp and safetensors
    create 0600 files)."""
    try:
        old = os.stat(target)
    except OSError:
        os.chmod(tmp, _mode_for(target))
        return
    try:            # best effort: only root may give a file away, a user only to his groups
        os.chown(tmp, old.st_uid if os.geteuid() == 0 else -1, old.st_gid)
    except (OSError, AttributeError):
        pass
    os.chmod(tmp, stat.S_IMODE(old.st_mode))     # after chown, which may clear set-id bits


def _mode_for(target):
    """Keep an existing file's permissions; give a new one what open() would."""
    try:
        return stat.S_IMODE(os.stat(target).st_mode)
    except OSError:
        pass
    try:   # the umask, without os.umask's set-and-restore race between threads
        umask = int(re.search(r"Umask:\s*([0-7]+)", Path("/proc/self/status").read_text())[1], 8)
    except (OSError, TypeError):
        umask = 0o022
    return 0o666 & ~umask


def _fsync_folder(folder):
    # Makes the rename itself durable. Best effort: some systems cannot open a folder or
    # fsync one (EINVAL); the file's own data is already on disk.
    try:
        fd = os.open(folder, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0))
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def _reason(e):
    if isinstance(e, OSError) and e.strerror:
        return e.strerror
    return str(e) or type(e).__name__
