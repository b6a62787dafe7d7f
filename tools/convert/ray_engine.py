"""``shardfeed convert --engine ray``: one Ray task per part of a conversion.

The parts are those ``--processes`` writes; the datasink and datasource for
user code are in shardfeed.formats.ray_data.
"""

from __future__ import annotations

from shardfeed.formats import ShardError
from shardfeed.formats.ray_data import _import_ray


def _run_part(write_part, source, order, a, b, part_dir, opts):
    return write_part(source, order, a, b, part_dir, opts, lambda n: None)


def write_parts_on_ray(source, order, parts, dirs, opts, progress, write_part) -> list:
    """One Ray task per part (the same parts ``--processes`` writes), on the
    cluster at ``opts.address`` or a local instance of 2 CPUs started here.
    ``write_part`` is job.write_part, passed in so this module needs no import of job.py."""
    ray = _import_ray()
    started = not ray.is_initialized()
    if started:
        if opts.address:
            ray.init(address=opts.address, log_to_driver=False)
        else:
            ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    try:
        task = ray.remote(num_cpus=1, max_retries=2)(_run_part)
        refs = {task.remote(write_part, source, order, a, b, d, opts): (p, b - a) for p, ((a, b), d) in enumerate(zip(parts, dirs))}
        results = [None] * len(parts)
        pending = list(refs)
        try:
            while pending:
                done, pending = ray.wait(pending, num_returns=1, timeout=1.0)
                for ref in done:
                    p, count = refs[ref]
                    try:
                        results[p] = ray.get(ref)
                    except ray.exceptions.RayTaskError as e:
                        cause = e.as_instanceof_cause()
                        raise cause if isinstance(cause, ShardError) else ShardError(
                            dirs[p], f"Ray task of part {p} failed: {e}") from None
                    progress(count)
        except BaseException:
            for ref in pending:
                ray.cancel(ref, force=True)
            raise
        return results
    finally:
        if started:
            ray.shutdown()
