"""A compiled instance already in the store's format (service/store/codec.py), with what a store,
a listing and an instance's summary need to know of it: stored without being decoded (a worker
that posts a big instance need not build it again: whichever worker runs it decodes it then)."""

from __future__ import annotations

from dataclasses import dataclass, fields

from service.engine import CompiledInstance

from . import codec


@dataclass(frozen=True)
class EncodedInstance:
    header: bytes
    body: bytes
    content_hash: str
    kind: str
    n_hypotheses: int
    n_tests: int
    n_classes: int
    warnings: tuple[str, ...]
    is_decision: bool
    decision_labels: tuple[str, ...]

    @staticmethod
    def of(instance: CompiledInstance) -> EncodedInstance:
        header, body = codec.encode(instance)
        facts = {name: getattr(instance, name) for name in _FACTS}
        return EncodedInstance(header, body, **{**facts, "warnings": tuple(instance.warnings),
                                                "decision_labels": tuple(instance.decision_labels)})

    @property
    def encoded_size(self) -> int:
        return len(self.header) + len(self.body)

    def decoded(self) -> CompiledInstance:
        return codec.decode(self.header, self.body, self.content_hash)

    def facts(self) -> dict:
        """Its fields but the bytes: plain data."""
        return {name: getattr(self, name) for name in _FACTS}


_FACTS = tuple(field.name for field in fields(EncodedInstance) if field.name not in ("header", "body"))


def stored_size(instance: CompiledInstance | EncodedInstance) -> int:
    """What ``instance`` takes in the store (the per-tenant byte quota counts it)."""
    return instance.encoded_size if isinstance(instance, EncodedInstance) else codec.encoded_size(instance)
