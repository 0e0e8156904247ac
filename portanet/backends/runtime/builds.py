"""Kernel builds run several at once (a runtime's `build_many`)."""
import os
from concurrent.futures import ThreadPoolExecutor, as_completed

# the most builds run at once: enough for a GPU driver's compiles or nvcc's processes to
# fill the cores, few enough that their memory stays small
MAX_THREADS = 8


def in_threads(items, work, done=None, threads=None):
    """work(item) for each of `items` in up to `threads` worker threads (default: one per
    core, at most MAX_THREADS); done(item) in the calling thread as each finishes, in the
    order they finish. The first error raised by a work(item) is raised here once the
    others have finished."""
    items = list(items)
    threads = min(threads or MAX_THREADS, os.cpu_count() or 1, len(items))
    error = None
    if threads <= 1:
        for item in items:
            try:
                work(item)
            except Exception as e:      # (the first is raised; the rest are built)
                error = error or e
                continue
            if done is not None:
                done(item)
    else:
        with ThreadPoolExecutor(threads, thread_name_prefix="portanet-build") as pool:
            futures = {pool.submit(work, item): item for item in items}
            for future in as_completed(futures):
                try:
                    future.result()
                except Exception as e:  # (the first is raised; the rest finish)
                    error = error or e
                    continue
                if done is not None:
                    done(futures[future])
    if error is not None:
        raise error
