"""What a codec asks before it decodes a request, and the answers it may get (pure: no trio).

A codec that can build far more memory than the bytes it was sent (the
forward codec: msgpack and gzip) reports the worst-case cost of each
request, a pure function of its sizes, to a :data:`DecodeGate` before it
builds anything for it. The gate belongs to whoever runs the codec (the
server layer keeps one decode budget per process,
appliance/server/decode_budget.py) and answers:

* :attr:`Admit.GO`: decode it now;
* :attr:`Admit.LATER`: not now. The codec keeps the request as bytes,
  returns the events it has, and decodes the request when its ``resume()``
  is called (once the caller has waited for room);
* a ``str``: never. The reason; the codec refuses the request with it.
"""

from __future__ import annotations

import enum
from collections.abc import Callable
from typing import TypeAlias

__all__ = ["Admission", "Admit", "DecodeGate", "always"]


class Admit(enum.Enum):
    """A gate's answer when it does not refuse."""

    GO = "go"
    LATER = "later"


#: :class:`Admit`, or a ``str``: the request is refused for that reason.
Admission: TypeAlias = Admit | str
#: Called with a request's worst-case cost in bytes before it is decoded.
DecodeGate: TypeAlias = Callable[[int], Admission]


def always(cost: int) -> Admission:
    """The gate of a codec nobody budgets (tools, tests): every request goes."""
    return Admit.GO
