"""Label work done a block at a time (service/engine/blocks.py) gives what the single call over
every label gives: the same tuples, the same bytes, the same content hash."""

from __future__ import annotations

import hashlib

import numpy as np
import pytest

from schemas.instance import Instance
from service.engine import blocks, compile_instance
from service.engine.compiled import CompiledInstance

LABELS = [f"h{i}" if i % 7 else f"é{i}☃" for i in range(1000)]  # some labels wider than ASCII


@pytest.fixture
def small_blocks(monkeypatch):
    monkeypatch.setattr(blocks, "LABELS_PER_BLOCK", 64)


def test_blocks_give_what_one_call_gives(small_blocks):
    order = np.random.default_rng(0).permutation(len(LABELS))
    assert blocks.mapped(LABELS.__getitem__, order) == tuple(LABELS[i] for i in order.tolist())
    assert blocks.mapped(str, range(1000)) == tuple(str(i) for i in range(1000))
    classes = [LABELS[i % 300] for i in order.tolist()]
    assert blocks.first_appearances(classes) == tuple(dict.fromkeys(classes))
    assert b"".join(blocks.joined_utf8("\x1f", LABELS)) == "\x1f".join(LABELS).encode()
    assert blocks.joined_utf8("\x1f", []) == [b""]
    digest, reference = hashlib.sha256(), hashlib.sha256()
    blocks.update_joined(digest, "\x1f", LABELS)
    joined = "\x1f".join(LABELS).encode()
    reference.update(len(joined).to_bytes(8, "little") + joined)
    assert digest.hexdigest() == reference.hexdigest()


def test_content_hash_does_not_depend_on_the_block_size(monkeypatch):
    document = {"tests": [{"id": "t0"}, {"id": "t1"}], "hypothesis_ids": LABELS,
                "classes": [f"c{i % 13}" for i in range(len(LABELS))],
                "matrix": [[i % 2, (i // 2) % 3] for i in range(len(LABELS))]}

    def compiled(size: int) -> CompiledInstance:
        monkeypatch.setattr(blocks, "LABELS_PER_BLOCK", size)
        return compile_instance(Instance.model_validate(document))

    whole, split = compiled(1 << 20), compiled(37)
    assert split.hypothesis_ids == whole.hypothesis_ids and split.class_labels == whole.class_labels
    assert split.content_hash == whole.content_hash
