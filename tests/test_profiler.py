"""``tokenyard profile`` and the profiler behind it, on the CPU with a tiny model."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import pytest

pytest.importorskip("torch")

from tokenyard import cli
from tokenyard.errors import ConfigError
from tokenyard.predictor.profiles import COMM_OPS, OPS, OUR_COLUMNS, read_profiles
from tokenyard.profiler import ProfileGrid, profile_model, write_profile
from tokenyard.profiler import cli as profile_cli

TINY = SimpleNamespace(
    name="tiny",
    num_layers=2,
    hidden_size=256,
    num_heads=4,
    num_kv_heads=2,
    intermediate_size=512,
    vocab_size=1000,
)


def test_tiny_grid_times_every_compute_op() -> None:
    grid = ProfileGrid.preset("tiny")
    rows = profile_model(TINY, grid=grid, device="cpu", repeats=3, warmup=1)
    ops = {r["op"] for r in rows}
    assert ops == set(OPS) - set(COMM_OPS)
    assert all(r["time_ms"] > 0 and r["time_ms_p90"] >= r["time_ms"] for r in rows)
    assert all(set(r) == set(OUR_COLUMNS) for r in rows)
    prefill = [r for r in rows if r["op"] == "attn_prefill"]
    assert len(prefill) == len(grid.prefill_batch_sizes) * len(grid.prefill_context_lens)
    assert all(r["num_tokens"] is None and r["chunk_size"] == 8 for r in prefill)
    qkv = [r for r in rows if r["op"] == "qkv_proj"]
    assert [r["num_tokens"] for r in qkv] == list(grid.num_tokens)
    first = rows[0]
    assert (first["device"], first["dtype"], first["backend"], first["model"]) == (
        "cpu",
        "bf16",
        "torch",
        "tiny",
    )
    assert (first["head_dim"], first["repeats"], first["tensor_parallel_size"]) == (64, 3, 1)


def test_repeats_are_split_over_rounds_through_the_grid() -> None:
    grid = ProfileGrid.preset("tiny")
    seen: list[tuple[int, int, str]] = []
    rows = profile_model(
        TINY,
        grid=grid,
        device="cpu",
        repeats=5,
        warmup=0,
        rounds=2,
        progress=lambda done, total, op: seen.append((done, total, op)),
    )
    assert {r["repeats"] for r in rows} == {5}  # 3 runs in the first pass, 2 in the second
    assert seen[-1][0] == seen[-1][1] == 2 * len(rows)  # every shape visited in both passes
    more_rounds = profile_model(TINY, grid=grid, device="cpu", repeats=2, warmup=0, rounds=4)
    assert {r["repeats"] for r in more_rounds} == {2}
    with pytest.raises(ConfigError):
        profile_model(TINY, grid=grid, device="cpu", rounds=0)


def test_tensor_parallel_shard_and_memory_cap() -> None:
    grid = ProfileGrid(
        num_tokens=(4,),
        prefill_batch_sizes=(1,),
        prefill_chunk_sizes=(4,),
        prefill_context_lens=(0,),
        decode_batch_sizes=(1,),
        decode_context_lens=(8,),
    )
    rows = profile_model(TINY, tensor_parallel_size=2, grid=grid, device="cpu", repeats=1)
    assert {r["tensor_parallel_size"] for r in rows} == {2}
    capped = profile_model(
        TINY, grid=grid, device="cpu", repeats=1, warmup=0, memory_cap_bytes=64 * 1024
    )
    ops = {r["op"] for r in capped}
    assert "lm_head" not in ops  # 1000 x 256 weights do not fit in 64 KiB
    assert "residual_add" in ops


def test_moe_model_times_routed_rows() -> None:
    moe = SimpleNamespace(**{**vars(TINY), "num_experts": 4, "experts_per_token": 2})
    grid = ProfileGrid(
        num_tokens=(1, 16),
        prefill_batch_sizes=(1,),
        prefill_chunk_sizes=(4,),
        prefill_context_lens=(0,),
        decode_batch_sizes=(1,),
        decode_context_lens=(8,),
    )
    rows = profile_model(moe, grid=grid, device="cpu", dtype="fp32", repeats=1)
    assert [r["num_tokens"] for r in rows if r["op"] == "gate_up_proj"] == [1, 16]


def test_triton_backend_needs_cuda() -> None:
    with pytest.raises(ConfigError, match="need a CUDA GPU") as e:
        profile_model(TINY, device="cpu", backend="triton", grid=ProfileGrid.preset("tiny"))
    assert e.value.field == "backend"


@pytest.mark.parametrize(
    ("kwargs", "field"),
    [
        ({"tensor_parallel_size": 3}, "tensor_parallel_size"),
        ({"tensor_parallel_size": 0}, "tensor_parallel_size"),
        ({"dtype": "fp8"}, "dtype"),
        ({"backend": "cuda"}, "backend"),
        ({"device": "tpu"}, "device"),
        ({"repeats": 0}, "repeats"),
        ({"warmup": -1}, "warmup"),
    ],
)
def test_bad_arguments(kwargs: dict[str, object], field: str) -> None:
    with pytest.raises(ConfigError) as e:
        profile_model(TINY, grid=ProfileGrid.preset("tiny"), **kwargs)  # type: ignore[arg-type]
    assert e.value.field == field


def test_grid_validation() -> None:
    with pytest.raises(ConfigError, match="num_tokens") as e:
        ProfileGrid((0,), (1,), (1,), (0,), (1,), (1,))
    assert e.value.field == "grid.num_tokens"
    with pytest.raises(ConfigError, match="unknown grid"):
        ProfileGrid.preset("huge")
    default = ProfileGrid.preset("default")
    assert default.num_tokens[:6] == (1, 2, 3, 4, 6, 8)
    assert default.num_tokens[-1] == 16384
    assert max(default.prefill_context_lens) == 32768
    assert max(default.decode_batch_sizes) == 512


def test_write_profile_replaces_atomically(tmp_path: Path) -> None:
    path = tmp_path / "p.csv"
    path.write_text("old")
    row = dict.fromkeys(OUR_COLUMNS)
    row.update(op="act", num_tokens=8, time_ms=0.5, device="cpu", model="m", tensor_parallel_size=1)
    write_profile([row], path)
    assert [p.name for p in tmp_path.iterdir()] == ["p.csv"]
    assert path.read_text().splitlines()[0] == ",".join(OUR_COLUMNS)
    assert read_profiles([path]).ops["act"].time_s.tolist() == [0.5e-3]


# --- the command --------------------------------------------------------------------------


def test_cli_end_to_end(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    # A catalog 7B on the tiny grid takes ~20 s on two cores; the command runs on TINY.
    seen: list[str] = []

    def lookup(name: str) -> object:
        seen.append(name)
        return TINY

    monkeypatch.setattr(profile_cli, "_model", lookup)
    out = tmp_path / "profile.csv"
    code = cli.main(
        [
            "profile",
            "--model",
            "llama-2-7b",
            "--device",
            "cpu",
            "--grid",
            "tiny",
            "--repeats",
            "2",
            "--warmup",
            "0",
            "--out",
            str(out),
        ]
    )
    text = capsys.readouterr().out
    assert code == 0
    assert seen == ["llama-2-7b"]
    assert "qkv_proj" in text
    assert "3 shapes" in text
    assert "all_reduce, send_recv: skipped" in text
    assert f"wrote {out}" in text
    ps = read_profiles([out])
    assert set(ps.ops) == set(OPS) - set(COMM_OPS)


@pytest.mark.parametrize(
    ("argv", "flag"),
    [
        (["--model", "no-such-model"], "--model"),
        (["--model", "llama-2-7b", "--tp", "3"], "--tp"),
        (["--model", "llama-2-7b", "--grid", "huge"], "--grid"),
        (["--model", "llama-2-7b", "--dtype", "fp8"], "--dtype"),
        (["--model", "llama-2-7b", "--device", "cpu", "--backend", "triton"], "--backend"),
        (["--model", "llama-2-7b", "--repeats", "0"], "--repeats"),
    ],
)
def test_cli_errors_exit_2_with_the_flag(
    argv: list[str], flag: str, capsys: pytest.CaptureFixture[str]
) -> None:
    code = cli.main(["profile", "--device", "cpu", *argv])
    err = capsys.readouterr().err
    assert code == 2
    # The last line is the error (a note about 16-bit dtypes on a CPU may come first).
    last = err.strip().splitlines()[-1]
    assert last.startswith("tokenyard profile: error: ")
    assert flag in last
    assert "Traceback" not in err
