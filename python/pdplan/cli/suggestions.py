"""What would work instead, when a layout does not."""

from __future__ import annotations

import argparse
from dataclasses import replace

from pdplan._layouts import (
    ModelShape,
)
from pdplan._model import UnsupportedPDLayoutError
from pdplan.cli.deployment import Deployment


def suggestion(args: argparse.Namespace, shape: ModelShape) -> str:
    """What would work with the rest as given: DCP sizes when context parallelism is in play,
    else TP sizes."""
    deployment = Deployment.from_args(args)

    def works(**changed: int) -> bool:
        try:
            replace(deployment, **changed).planner(shape)  # type: ignore[arg-type]
        except UnsupportedPDLayoutError:
            return False
        return True

    parts = []
    spread = ("prefill_cp", "decode_cp", "prefill_dcp", "decode_dcp")
    if any(getattr(args, name) > 1 for name in spread):
        for side in ("decode", "prefill"):
            tp = getattr(args, f"{side}_tp")
            if getattr(args, f"{side}_dcp") > 1:
                divisors = [n for n in range(2, tp + 1) if tp % n == 0]
                dcp = [n for n in divisors if works(**{f"{side}_dcp": n})]
                if dcp:
                    parts.append(f"{side} DCP {', '.join(map(str, dcp))}")
        if not parts and works(**dict.fromkeys(spread, 1)):
            parts.append("the same TP sizes without context parallelism")
        return "; would work: " + " or ".join(parts) if parts else ""
    sizes = [1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 48, 64]
    decode = [n for n in sizes if works(decode_tp=n)]
    prefill = [n for n in sizes if works(prefill_tp=n)]
    if decode:
        parts.append(f"decode TP {', '.join(map(str, decode))} with prefill TP {args.prefill_tp}")
    if prefill:
        parts.append(f"prefill TP {', '.join(map(str, prefill))} with decode TP {args.decode_tp}")
    return "; would work: " + " or ".join(parts) if parts else ""
