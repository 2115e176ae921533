"""An instance compiled before it reached the domain: a big request's, compiled and encoded by
its worker's isolated process (service/api/isolation.py). It stands where the wire
:class:`Instance` would (a session request's ``instance``, ``register_instance``'s argument),
with none of its fields: :meth:`Sessions.register_instance` stores its encoded form as it is,
:meth:`Sessions.compile` decodes it, and either raises the error its compilation raised, where
compiling it would have raised it."""

from __future__ import annotations

from pydantic import PrivateAttr

from schemas.instance import Instance
from service import engine
from service.store.encoded import EncodedInstance


class PrecompiledInstance(Instance):
    _encoded: EncodedInstance | Exception | None = PrivateAttr(default=None)

    @classmethod
    def of(cls, encoded: EncodedInstance | Exception) -> PrecompiledInstance:
        """Standing for ``encoded``, or for an instance whose compilation raised that error."""
        stand_in = cls.model_construct()  # no field: validated and checked where it was compiled
        stand_in._encoded = encoded
        return stand_in

    @property
    def encoded(self) -> EncodedInstance:
        if isinstance(self._encoded, Exception):
            raise self._encoded
        assert self._encoded is not None
        return self._encoded

    def compiled(self) -> engine.CompiledInstance:
        return self.encoded.decoded()
