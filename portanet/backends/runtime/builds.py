"""Kernel builds run several at once (a runtime's `build_many`)."""
import os
from concurrent.futures import ThreadPoolExecutor, as_completed

# the most builds run at once: enough for a GPU driver's compiles or nvcc's processes to
# fill the cores, few enough that their memory stays small
MAX_THREADS = 16


def in_threads(items, work, done=None, threads=None):
    """work(item) for each of `items` in up to `threads` worker threads (default: one per
    core, at most MAX_THREADS); done(item) in the calling thread as each finishes, in the
    order they finish. The first error raised by a work(item) is raised here once the
    others have finished."""
    items = list(items)
    threads = min(threads or MAX_THREADS, os.cpu_count() or 1, len(items))
    error = None
    for item, failed in _finished(items, work, threads):
        if failed is None:
            if done is not None:
                done(item)
        else:                           # (the first is raised; the rest are built)
            error = error or failed
    if error is not None:
        raise error


def _finished(items, work, threads):
    """(item, None or the Exception work(item) raised) as each finishes: in this thread
    where threads <= 1, else in a pool of them."""
    if threads <= 1:
        for item in items:
            try:
                work(item)
            except Exception as e:
                yield item, e
                continue
            yield item, None
        return
    with ThreadPoolExecutor(threads, thread_name_prefix="portanet-build") as pool:
        futures = {pool.submit(work, item): item for item in items}
        for future in as_completed(futures):
            try:
                future.result()
            except Exception as e:
                yield futures[future], e
                continue
            yield futures[future], None
