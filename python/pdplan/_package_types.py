"""Hands the compiled core the package's classes it makes objects of, once, on import.

The core (``pdplan._core``) builds fragments, plans, layouts, layer kinds, descriptor columns
and staging counts as these classes' instances. The modules defining them import the core, so
the core cannot import them back: they come to it here instead, and no import runs in a
circle."""

from __future__ import annotations

from pdplan import _core, _layouts
from pdplan._descriptors import StridedDescriptors, TransferDescriptors
from pdplan._model import BufferKind, BufferLayout, RankTransferPlan, TransferFragment
from pdplan._staging import StagingCounts

_core.use_package_types(
    {
        "BufferKind": BufferKind,
        "BufferLayout": BufferLayout,
        "RankTransferPlan": RankTransferPlan,
        "TransferFragment": TransferFragment,
        "TransferDescriptors": TransferDescriptors,
        "StridedDescriptors": StridedDescriptors,
        "StagingCounts": StagingCounts,
        # Every layer kind by its class name, from the core's own schema.
        **{name: getattr(_layouts, name) for _, name, _, _ in _core.LAYER_KINDS},
    }
)
