"""The cost model of the loaded model, measured without anyone waiting for it.

Measuring it (core/calibrate.py) takes ~7.6 s on the demo model; when the first `depth: "auto"`
request did it inside itself, every user behind it stalled as long. Now:

- at start, a measurement saved for this machine and model is reused (a JSON file per
  (device, BLAS, mlx, CPU) x (checkpoint, its files, the adapter's description) under
  settings.costs_dir, ~/.cache/mtp-chat/costs by default);
- warm-up measures what is missing, before the server listens, and saves it;
- without warm-up, an `auto` request at a context bucket not measured yet decodes with the
  unmeasured policy (core/costs.DepthPolicy: depth 1) and asks for the measurement, which the
  model thread runs slice by slice in idle time (webapp/serving/worker.py); when it lands, running and
  later `auto` replies use it, and it is saved.
"""
from __future__ import annotations

import json
import os
import platform
from pathlib import Path
from typing import Callable, Optional

DEFAULT_DIR = Path("~/.cache/mtp-chat/costs")


def _cpu() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            return next((l.split(":", 1)[1].strip() for l in f if l.startswith("model name")), platform.processor())
    except OSError:
        return platform.processor()


def machine() -> dict:
    from adapters.runtime import runtime_info

    info = runtime_info()
    return {k: info.get(k) for k in ("os", "machine", "mlx", "mlx_lm", "device", "blas")} | {
        "cpu": _cpu(), "cores": os.cpu_count()}


def model(adapter, path: Optional[Path]) -> dict:
    files = {}
    if path is not None:
        for f in sorted(Path(path).glob("**/*.safetensors")) + [Path(path) / "config.json"]:
            if f.is_file():
                st = f.stat()
                files[str(f.relative_to(path))] = [st.st_size, int(st.st_mtime)]
    return {"path": str(Path(path).resolve()) if path else None, "describe": adapter.describe(), "files": files}


class Calibration:
    """What the cost model of one loaded adapter is, and the work of measuring it."""

    def __init__(self, adapter, worker, path: Optional[Path], costs_dir: Optional[str], max_depth: int,
                 log: Callable[[str], None] = lambda m: None, max_batch: int = 1):
        from core import calibrate

        self.adapter, self.worker, self.log = adapter, worker, log
        self.max_width = max_depth + 1
        # Batched requests: 'auto' prices the batch size too (core.costs.Costs.at_batch).
        self.batch_sizes = calibrate.batch_sizes_up_to(max_batch)
        self._pending = set()          # buckets asked for and not measured yet
        self.file = None
        if costs_dir != "":
            root = Path(costs_dir).expanduser() if costs_dir else DEFAULT_DIR.expanduser()
            self._about = {"machine": machine(), "model": model(adapter, path)}
            self.file = root / f"{calibrate.key(self._about['machine'], self._about['model'])}.json"
            n = calibrate.load(adapter, self.file)
            if n:
                log(f"cost model: {n} context bucket(s) from {self.file}")

    def needed(self, context: int) -> bool:
        from core.calibrate import needs_calibration

        return needs_calibration(self.adapter, self.max_width, context, self.batch_sizes)

    def measure_now(self, context: int = 64) -> bool:
        """Measure on the model thread, waiting for it (warm-up); True when something was measured."""
        from core.calibrate import calibration

        if not self.needed(context):
            return False
        self.worker.call(lambda: [None for _ in calibration(self.adapter, self.max_width, context,
                                                            batch_sizes=self.batch_sizes)])
        self._save()
        return True

    def when_idle(self, context: int) -> None:
        """Measure this context's bucket in idle time, unless known or already asked for."""
        from core.costs import context_bucket

        bucket = context_bucket(context)
        if bucket in self._pending or not self.needed(context):
            return
        self._pending.add(bucket)
        self.worker.in_idle_time(self._slices(context, bucket))

    def _slices(self, context: int, bucket: int):
        from core.calibrate import calibration

        try:
            yield from calibration(self.adapter, self.max_width, context, batch_sizes=self.batch_sizes)
        finally:
            self._pending.discard(bucket)
        self._save()
        self.log(f"cost model: measured the {bucket}-token context bucket in idle time")

    def _save(self) -> None:
        from core import calibrate

        if self.file is not None:
            try:
                calibrate.save(self.adapter, self.file, self._about)
            except OSError as exc:
                self.log(f"cost model: not saved ({exc})")
