"""What can go wrong in a transfer session, by type. Every fault is an
``UnsupportedPDLayoutError``, so code that catches that keeps working; a runtime that wants to
act by cause (retry a gone peer, alert on a version skew) catches the subclass. ``cause``
names each type in logs and metrics."""

from __future__ import annotations

from pdplan._core import UnsupportedPDLayoutError


class TransferFault(UnsupportedPDLayoutError):
    """A transfer session's fault: the base of every type below."""

    cause = "fault"


class PeerGone(TransferFault):
    """A peer that did not answer in time (dead, not started, or too slow)."""

    cause = "peer_gone"


class ProtocolFault(TransferFault):
    """Bytes from a peer that are not the side channel's protocol (malformed, oversized, or
    another protocol)."""

    cause = "protocol"


class LayoutRefused(TransferFault):
    """Two instances whose caches cannot pair: another model, dtype or cache groups, or
    layouts the planner refuses."""

    cause = "layout"


class SettingsFault(TransferFault):
    """A setting or request parameter the session cannot use (an unknown key, a bad value,
    a port already taken)."""

    cause = "settings"


class VersionSkew(TransferFault):
    """A peer running another protocol or planner version."""

    cause = "version"


class TransferFailed(TransferFault):
    """The transfer engine reported a read failed, or it ran past its timeout."""

    cause = "transfer"


class LeaseExpired(TransferFault):
    """The prefill side freed a request's blocks (its lease ran out) before a read of them
    was confirmed, or did not confirm it held them through the read."""

    cause = "lease"


#: Each fault type by its cause: a peer's refusal names the cause, and is raised as its type.
FAULTS: dict[str, type[TransferFault]] = {
    kind.cause: kind
    for kind in (
        PeerGone,
        ProtocolFault,
        LayoutRefused,
        SettingsFault,
        VersionSkew,
        TransferFailed,
        LeaseExpired,
    )
}


def fault_of(cause: str, message: str) -> TransferFault:
    """The fault a peer's refusal of ``cause`` stands for (an unknown cause: the base)."""
    return FAULTS.get(cause, TransferFault)(message)


def cause_of(error: BaseException) -> str:
    """The cause a fault is counted under: its type's, ``layout`` for the planner's own
    refusals, ``internal`` for anything else."""
    if isinstance(error, TransferFault):
        return error.cause
    if isinstance(error, UnsupportedPDLayoutError):
        return LayoutRefused.cause
    return "internal"
