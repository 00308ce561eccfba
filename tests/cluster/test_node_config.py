"""cluster.config and cluster.protocol: round trips and validation."""

from __future__ import annotations

import dataclasses
import stat
from pathlib import Path

import cbor2
import pytest

from cluster import config, protocol
from cluster.errors import ConfigError, ProtocolError


def _sample(tmp_path: Path) -> config.ClusterConfig:
    nodes = tuple(
        config.NodeConfig(f"n{i}", "127.0.0.1", 7000 + i, 8000 + i, tmp_path / f"n{i}")
        for i in range(1, 4)
    )
    return config.ClusterConfig("test", 1, nodes, fsync="always")


def test_config_round_trips_through_toml(tmp_path: Path) -> None:
    """write then load gives back an equal config."""
    cfg = _sample(tmp_path)
    config.write(tmp_path, cfg)
    assert config.load(tmp_path) == cfg


def test_peer_addresses_round_trip(tmp_path: Path) -> None:
    """Per-node peer dial addresses (chaos proxies) survive write and load."""
    cfg = _sample(tmp_path)
    first = dataclasses.replace(cfg.nodes[0], peer_addresses={"n2": "127.0.0.1:9", "n3": "h:10"})
    cfg = dataclasses.replace(cfg, nodes=(first, *cfg.nodes[1:]))
    config.write(tmp_path, cfg)
    assert config.load(tmp_path).nodes[0].peer_addresses == {"n2": "127.0.0.1:9", "n3": "h:10"}


def test_invalid_config_is_a_config_error(tmp_path: Path) -> None:
    """A bad fsync policy and a missing file are both ConfigError."""
    with pytest.raises(ConfigError):
        config.load(tmp_path)
    (tmp_path / "cluster.toml").write_text('[cluster]\nfsync = "sometimes"\n')
    with pytest.raises(ConfigError):
        config.load(tmp_path)


def test_secret_and_client_key_are_private_and_consistent(tmp_path: Path) -> None:
    """The secret and client key files are mode 0600 and the key derives from the secret."""
    secret = config.create_secret(tmp_path)
    assert config.read_secret(tmp_path) == secret
    assert config.read_client_key(tmp_path / "client.key") == config.client_key(secret)
    for name in ("secret", "client.key"):
        assert stat.S_IMODE((tmp_path / name).stat().st_mode) == 0o600


def test_frame_codec_rejects_garbage_and_oversize() -> None:
    """Non-CBOR, non-map and oversized frames raise ProtocolError with the right code."""
    frame = protocol.encode_frame({"op": "hello"})
    assert protocol.decode_body(frame[4:]) == {"op": "hello"}
    with pytest.raises(ProtocolError) as info:
        protocol.decode_body(b"\xff\xfe")
    assert info.value.code == protocol.BAD_FRAME
    with pytest.raises(ProtocolError):
        protocol.decode_body(cbor2.dumps([1, 2]))
    with pytest.raises(ProtocolError) as info:
        protocol.check_length(100, frame_bytes_max=10)
    assert info.value.code == protocol.FRAME_TOO_LARGE


def test_proof_verifies_only_with_the_right_key() -> None:
    """A proof made with another key is refused."""
    nonce = b"n" * 32
    assert protocol.verify_proof(b"k1", nonce, protocol.proof(b"k1", nonce))
    assert not protocol.verify_proof(b"k1", nonce, protocol.proof(b"k2", nonce))


def test_frame_decoder_splits_joins_and_reports_in_place() -> None:
    """Frames cut anywhere come out whole and in order; a bad one is reported where it was."""
    good = [protocol.encode_frame({"op": "query", "id": i}) for i in range(3)]
    garbage = b"\x00\x00\x00\x02\xff\xfe"
    stream = good[0] + garbage + good[1] + good[2]
    decoder = protocol.FrameDecoder()
    items = [item for i in range(0, len(stream), 5) for item in decoder.feed(stream[i : i + 5])]
    seen = [x.code if isinstance(x, ProtocolError) else x["id"] for x in items]
    assert seen == [0, protocol.BAD_FRAME, 1, 2]


def test_frame_decoder_stops_at_an_oversized_length() -> None:
    """A length above the limit is reported and nothing after it is parsed."""
    decoder = protocol.FrameDecoder(frame_bytes_max=100)
    items = decoder.feed(b"\x00\x00\x10\x00" + protocol.encode_frame({"op": "x"}))
    assert len(items) == 1 and isinstance(items[0], ProtocolError)
    assert items[0].code == protocol.FRAME_TOO_LARGE


def test_cost_check_refuses_many_items_tags_and_deep_nesting() -> None:
    """The pre-decode walk counts CBOR items (strings are one item, whatever their size)."""
    protocol.check_cost(cbor2.dumps({"op": "command", "id": 1, "cmd": b"x" * 1_000_000}), 8)
    protocol.check_cost(cbor2.dumps([0] * 100), 101)
    cases = {
        "items": (cbor2.dumps([0] * 101), "more than 101 CBOR items"),
        "tag": (cbor2.dumps([cbor2.CBORTag(30, [1, 3])]), "CBOR tag 30"),
        "depth": (b"\x81" * 70 + b"\x00", "nests deeper"),
        "indefinite": (b"\x9f\x00\xff", "indefinite"),
    }
    for name, (body, expected) in cases.items():
        with pytest.raises(ProtocolError) as info:
            protocol.check_cost(body, 101)
        assert info.value.code == protocol.BAD_FRAME, name
        assert expected in info.value.message, (name, info.value.message)
    protocol.check_cost(cbor2.dumps(cbor2.CBORTag(71_000, [1])), 8, lambda tag: tag >= 71_000)


def test_frame_decoder_with_an_item_budget_refuses_a_costly_frame_in_place() -> None:
    """Over SCAN_BYTES_MIN, a frame with more items than the budget is a bad_frame (parsing goes
    on); a larger frame holding one byte string passes; small frames are not walked."""
    costly = protocol.HEADER.pack(0) + cbor2.dumps({"op": "query", "x": [0] * 70_000})
    costly = protocol.HEADER.pack(len(costly) - 4) + costly[4:]
    bulky = protocol.encode_frame({"op": "command", "id": 1, "cmd": b"x" * 100_000})
    small = protocol.encode_frame({"op": "query", "id": 2, "args": {"ids": list(range(2000))}})
    decoder = protocol.FrameDecoder(items_max=protocol.FRAME_ITEMS_MAX)
    items = decoder.feed(costly + bulky + small)
    assert isinstance(items[0], ProtocolError) and items[0].code == protocol.BAD_FRAME
    assert [x["id"] for x in items[1:] if isinstance(x, dict)] == [1, 2]
    assert len(protocol.FrameDecoder().feed(costly)) == 1  # no budget: decoded as before
