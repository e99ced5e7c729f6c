"""Profile readers: our format and Vidur's CSVs into per-operation samples."""

from __future__ import annotations

import csv
import gzip
import lzma
from pathlib import Path

import numpy as np
import pytest

from tokenyard.errors import InputError
from tokenyard.predictor.profiles import (
    FEATURES,
    OPS,
    OUR_COLUMNS,
    ProfileError,
    read_profiles,
)

META = {
    "repeats": 5,
    "device": "h100-80gb",
    "device_name": "NVIDIA H100 80GB HBM3",
    "dtype": "bf16",
    "backend": "torch",
    "model": "tiny",
    "tensor_parallel_size": 1,
    "hidden_size": 256,
    "num_heads": 4,
    "num_kv_heads": 2,
    "head_dim": 64,
    "intermediate_size": 512,
    "torch_version": "2.5.0",
    "created_at": "2026-01-01T00:00:00+00:00",
}


def ours(path: Path, rows: list[dict[str, object]]) -> Path:
    with path.open("w", newline="") as f:
        w = csv.DictWriter(f, OUR_COLUMNS, lineterminator="\n")
        w.writeheader()
        for r in rows:
            w.writerow({**META, "time_ms_p90": r.get("time_ms"), **r})
    return path


def write_vidur(path: Path, header: list[str], rows: list[list[object]]) -> Path:
    text = "\n".join([",".join(header), *(",".join(map(str, r)) for r in rows)]) + "\n"
    if path.name.endswith(".xz"):
        path.write_bytes(lzma.compress(text.encode()))
    elif path.name.endswith(".gz"):
        path.write_bytes(gzip.compress(text.encode()))
    else:
        path.write_text(text)
    return path


def stats(op: str) -> list[str]:
    return [f"time_stats.{op}.{s}" for s in ("min", "max", "mean", "median", "std")]


def t(ms: float) -> list[float]:  # min, max, mean, median, std
    return [ms * 0.9, ms * 1.2, ms, ms, 0.01]


MLP_OPS = [
    "emb",
    "input_layernorm",
    "attn_pre_proj",
    "attn_rope",
    "attn_post_proj",
    "post_attention_layernorm",
    "mlp_up_proj",
    "mlp_act",
    "mlp_down_proj",
    "add",
]
MLP_HEADER = [
    "",
    *(c for op in MLP_OPS for c in stats(op)),
    "n_head",
    "n_kv_head",
    "n_embd",
    "n_expanded_embd",
    "vocab_size",
    "use_gated_mlp",
    "num_tokens",
    "num_tensor_parallel_workers",
]


def mlp_row(i: int, num_tokens: int, tp: int, base_ms: float) -> list[object]:
    times = [v for k in range(len(MLP_OPS)) for v in t(base_ms * (k + 1))]
    return [i, *times, 32, 32, 4096, 11008, 32768, "True", num_tokens, tp]


ATTN_HEADER = [
    *stats("attn_kv_cache_save"),
    *stats("attn_decode"),
    *stats("attn_prefill"),
    "n_embd",
    "n_q_head",
    "n_kv_head",
    "block_size",
    "num_tensor_parallel_workers",
    "max_model_len",
    "batch_size",
    "prefill_chunk_size",
    "kv_cache_size",
    "is_prefill",
    "attention_backend",
    "profile_method",
]
ATTN_TAIL = [4096, 32, 32, 16]
EMPTY = ["", "", "", "", ""]


def attn_rows() -> list[list[object]]:
    backend = ["AttentionBackend.FLASH_ATTENTION", "ProfileMethod.KINETO"]
    return [
        # decode: batch 8 over 1024 cached tokens; prefill: chunk 512 after 256 cached
        [*t(0.002), *t(0.05), *EMPTY, *ATTN_TAIL, 1, 4096, 8, 0, 1024, "False", *backend],
        [*t(0.004), *EMPTY, *t(0.3), *ATTN_TAIL, 1, 4096, 1, 512, 256, "True", *backend],
        [*t(0.004), *EMPTY, *t(0.2), *ATTN_TAIL, 2, 4096, 1, 512, 256, "True", *backend],
    ]


NET_TAIL = ["rank", "num_workers", "size", "collective", "devices_per_node"]


def net_header(op: str) -> list[str]:
    return ["", *stats(op), *NET_TAIL, "max_devices_per_node"]


@pytest.fixture
def vidur_dir(tmp_path: Path) -> Path:
    d = tmp_path / "profiling" / "h100"
    d.mkdir(parents=True)
    write_vidur(d / "mlp.csv", MLP_HEADER, [mlp_row(0, 64, 1, 0.01), mlp_row(1, 128, 1, 0.02)])
    write_vidur(d / "attention.csv.xz", ATTN_HEADER, attn_rows())
    write_vidur(
        d / "all_reduce.csv.gz",
        net_header("all_reduce"),
        [
            [0, *t(0.03), 0, 2, 2048, "all_reduce", 2, 8],
            [1, *t(0.04), 0, 2, 4096, "all_reduce", 2, 8],
            [2, *t(0.09), 0, 2, 4096, "all_reduce", 1, 8],  # two nodes: not TP
            [3, *t(0.05), 0, 4, 4096, "all_reduce", 4, 8],
        ],
    )
    write_vidur(
        d / "send_recv.csv",
        net_header("send_recv"),
        [[0, *t(0.017), 0, 2, 2048, "send_recv", 1, 8]],
    )
    write_vidur(d / "cpu_overheads.csv", ["model_name", "schedule_median"], [["x", 1.0]])
    return d


# --- our format ---------------------------------------------------------------------------


def test_our_format_features_follow_the_contract(tmp_path: Path) -> None:
    path = ours(
        tmp_path / "p.csv",
        [
            {"op": "qkv_proj", "num_tokens": 32, "time_ms": 0.5},
            {
                "op": "attn_prefill",
                "batch_size": 2,
                "chunk_size": 8,
                "context_len": 16,
                "time_ms": 0.25,
            },
            {"op": "attn_decode", "batch_size": 4, "context_len": 64, "time_ms": 0.125},
            {"op": "residual_add", "num_tokens": 32, "time_ms": 0.01},
            {"op": "residual_add", "num_tokens": 32, "time_ms": 0.03},
        ],
    )
    ps = read_profiles([path])
    assert ps.device == "h100-80gb"
    assert ps.model == "tiny"
    assert ps.sources == (str(path),)
    prefill = ps.ops["attn_prefill"]
    assert prefill.feature_names == ("num_tokens", "mean_context")
    assert prefill.features.tolist() == [[16.0, 20.5]]  # 2 x 8 tokens; 16 + (8 + 1) / 2
    assert prefill.time_s.tolist() == [0.25e-3]
    assert ps.ops["attn_decode"].features.tolist() == [[4.0, 64.0]]
    assert ps.ops["qkv_proj"].features.tolist() == [[32.0]]
    assert ps.ops["residual_add"].time_s.tolist() == pytest.approx([1e-5, 3e-5])  # both kept
    assert list(ps.ops) == [op for op in OPS if op in ps.ops]


def test_our_format_comm_rows_keep_the_asked_worker_count(tmp_path: Path) -> None:
    path = ours(
        tmp_path / "p.csv",
        [
            {"op": "qkv_proj", "num_tokens": 8, "time_ms": 0.5, "tensor_parallel_size": 2},
            {"op": "all_reduce", "num_bytes": 1024, "num_workers": 2, "time_ms": 0.02},
            {"op": "all_reduce", "num_bytes": 1024, "num_workers": 4, "time_ms": 0.03},
            {"op": "send_recv", "num_bytes": 1024, "num_workers": 2, "time_ms": 0.01},
        ],
    )
    ps = read_profiles([path], tensor_parallel_size=2)
    assert ps.ops["all_reduce"].features.tolist() == [[1024.0]]
    assert ps.ops["all_reduce"].time_s.tolist() == [0.02e-3]
    assert ps.ops["send_recv"].features.tolist() == [[1024.0]]
    assert ps.ops["qkv_proj"].features.tolist() == [[8.0]]
    assert ps.tensor_parallel_size == 2


def test_round_trip_from_the_profiler(tmp_path: Path) -> None:
    pytest.importorskip("torch")
    from tokenyard.profiler import ProfileGrid, profile_model, write_profile

    grid = ProfileGrid(
        num_tokens=(4,),
        prefill_batch_sizes=(2,),
        prefill_chunk_sizes=(8,),
        prefill_context_lens=(16,),
        decode_batch_sizes=(3,),
        decode_context_lens=(40,),
    )
    rows = profile_model(TinyModel(), grid=grid, device="cpu", dtype="fp32", repeats=2, warmup=0)
    path = write_profile(rows, tmp_path / "out" / "profile.csv")
    ps = read_profiles([path])
    assert ps.model == "tiny-test"
    assert ps.device == "cpu"
    assert ps.ops["attn_prefill"].features.tolist() == [[16.0, 20.5]]
    assert ps.ops["attn_decode"].features.tolist() == [[3.0, 40.0]]
    assert ps.ops["lm_head"].features.tolist() == [[4.0]]
    by_op = {r["op"]: r for r in rows}
    assert ps.ops["down_proj"].time_s[0] == pytest.approx(by_op["down_proj"]["time_ms"] / 1e3)


class TinyModel:
    name = "tiny-test"
    hidden_size = 256
    num_heads = 4
    num_kv_heads = 2
    intermediate_size = 512
    vocab_size = 1000


# --- Vidur --------------------------------------------------------------------------------


def test_vidur_directory_maps_ops_and_milliseconds(vidur_dir: Path) -> None:
    ps = read_profiles([vidur_dir])
    assert ps.device == "h100"
    assert ps.model is None
    assert [Path(s).name for s in ps.sources] == [
        "all_reduce.csv.gz",
        "attention.csv.xz",
        "mlp.csv",
        "send_recv.csv",
    ]
    # mlp.csv: op k (0-based, in MLP_OPS order) took base * (k + 1) ms
    for k, ours_op in enumerate(
        [
            "embedding",
            "input_norm",
            "qkv_proj",
            "rope",
            "o_proj",
            "post_attn_norm",
            "gate_up_proj",
            "act",
            "down_proj",
            "residual_add",
        ]
    ):
        s = ps.ops[ours_op]
        assert s.features.tolist() == [[64.0], [128.0]]
        assert s.time_s == pytest.approx([0.01e-3 * (k + 1), 0.02e-3 * (k + 1)])
    assert ps.ops["attn_decode"].features.tolist() == [[8.0, 1024.0]]
    assert ps.ops["attn_decode"].time_s == pytest.approx([0.05e-3])
    assert ps.ops["attn_prefill"].features.tolist() == [[512.0, 256 + 513 / 2]]
    assert ps.ops["attn_prefill"].time_s == pytest.approx([0.3e-3])
    # kv_store: batch tokens for decode rows, batch x chunk for prefill rows
    assert ps.ops["kv_store"].features.tolist() == [[8.0], [512.0]]
    assert ps.ops["kv_store"].time_s == pytest.approx([0.002e-3, 0.004e-3])
    assert "all_reduce" not in ps.ops  # TP 1: no all-reduce
    assert ps.ops["send_recv"].features.tolist() == [[2048.0]]  # size is bytes
    assert ps.ops["send_recv"].time_s == pytest.approx([0.017e-3])
    assert "lm_head" not in ps.ops


def test_a_simulation_trains_on_vidur_files(vidur_dir: Path, tmp_path: Path) -> None:
    """Vidur's files straight into ``execution.model = "profiled"``: the ops they time come
    from them, the LM head (which Vidur does not time) from the roofline."""
    from tokenyard.simulation import config_from_mapping, simulate

    config = config_from_mapping(
        {
            "replica": {"model": "llama-2-7b", "device": "h100-sxm"},
            "execution": {
                "model": "profiled",
                "profiled": {"profiles": [str(vidur_dir)], "cache_dir": str(tmp_path / "c")},
            },
            "workload": {
                "kind": "synthetic",
                "num_requests": 50,
                "arrival": {"kind": "poisson", "qps": 2.0},
                "prompt_tokens": {"kind": "fixed", "value": 200},
                "output_tokens": {"kind": "fixed", "value": 8},
            },
        }
    )
    result = simulate(config)
    sources = result.summary["config"]["execution"]["op_sources"]
    assert sources["qkv_proj"].startswith("profile:")
    assert sources["attn_decode"].startswith("profile:")
    assert sources["lm_head"] == "roofline"
    assert result.summary["num_requests"] == 50


def test_vidur_tensor_parallel_filter(vidur_dir: Path) -> None:
    ps = read_profiles([vidur_dir], tensor_parallel_size=2)
    assert set(ps.ops) == {"attn_prefill", "kv_store", "all_reduce", "send_recv"}
    assert ps.ops["attn_prefill"].time_s == pytest.approx([0.2e-3])
    # num_workers == 2 within one node only
    assert ps.ops["all_reduce"].features.tolist() == [[2048.0], [4096.0]]
    assert ps.ops["all_reduce"].time_s == pytest.approx([0.03e-3, 0.04e-3])


def test_vidur_file_named_explicitly_and_unknown_device(tmp_path: Path) -> None:
    path = write_vidur(tmp_path / "mlp.csv", MLP_HEADER, [mlp_row(0, 8, 1, 0.01)])
    ps = read_profiles([path])
    assert ps.device == "vidur"
    assert ps.ops["qkv_proj"].features.tolist() == [[8.0]]


def test_vidur_optional_columns_may_be_missing(tmp_path: Path) -> None:
    keep = [
        "attn_pre_proj",
        "attn_rope",
        "attn_post_proj",
        "mlp_up_proj",
        "mlp_act",
        "mlp_down_proj",
    ]
    header = [
        *(c for op in keep for c in stats(op)),
        "num_tokens",
        "num_tensor_parallel_workers",
        "n_expanded_embd",
    ]
    row: list[object] = [*(v for _ in keep for v in t(0.1)), 16, 1, 11008]
    ps = read_profiles([write_vidur(tmp_path / "mlp.csv", header, [row])])
    assert set(ps.ops) == {"qkv_proj", "rope", "o_proj", "gate_up_proj", "act", "down_proj"}


# --- errors --------------------------------------------------------------------------------


def test_missing_column_names_file_and_column(tmp_path: Path) -> None:
    header = [c for c in MLP_HEADER if c != "num_tokens"]
    row = mlp_row(0, 8, 1, 0.1)
    del row[MLP_HEADER.index("num_tokens")]
    path = write_vidur(tmp_path / "mlp.csv", header, [row])
    with pytest.raises(ProfileError, match="missing column 'num_tokens'") as e:
        read_profiles([path])
    assert e.value.field == f"{path}:num_tokens"
    assert isinstance(e.value, InputError)


def test_missing_column_in_our_format(tmp_path: Path) -> None:
    path = tmp_path / "p.csv"
    path.write_text("op,num_tokens,time_ms\nqkv_proj,8,0.5\n")
    with pytest.raises(ProfileError, match="missing column 'batch_size'") as e:
        read_profiles([path])
    assert e.value.field == f"{path}:batch_size"


@pytest.mark.parametrize("bad", ["abc", "-1", "nan", "inf", ""])
def test_bad_value_names_file_line_and_column(tmp_path: Path, bad: str) -> None:
    rows = [mlp_row(0, 8, 1, 0.1), mlp_row(1, 16, 1, 0.1)]
    column = "time_stats.mlp_up_proj.median"
    rows[1][MLP_HEADER.index(column)] = bad
    path = write_vidur(tmp_path / "mlp.csv", MLP_HEADER, rows)
    with pytest.raises(ProfileError) as e:
        read_profiles([path])
    assert e.value.field == f"{path}:3:{column}"  # header is line 1
    assert e.value.value == bad
    assert f"{path}:3:{column}" in str(e.value)


def test_bad_flag_in_attention(tmp_path: Path) -> None:
    rows = attn_rows()
    rows[0][ATTN_HEADER.index("is_prefill")] = "maybe"
    path = write_vidur(tmp_path / "attention.csv", ATTN_HEADER, rows)
    with pytest.raises(ProfileError, match="expected True or False") as e:
        read_profiles([path])
    assert e.value.field == f"{path}:2:is_prefill"


def test_unknown_op(tmp_path: Path) -> None:
    path = ours(tmp_path / "p.csv", [{"op": "flash_attn", "num_tokens": 8, "time_ms": 1}])
    with pytest.raises(ProfileError, match="unknown op") as e:
        read_profiles([path])
    assert e.value.field == f"{path}:2:op"
    assert e.value.value == "flash_attn"


def test_mixed_devices(tmp_path: Path) -> None:
    a = ours(tmp_path / "a.csv", [{"op": "act", "num_tokens": 8, "time_ms": 1}])
    b = ours(tmp_path / "b.csv", [{"op": "act", "num_tokens": 8, "time_ms": 1, "device": "a100"}])
    with pytest.raises(ProfileError, match="several devices") as e:
        read_profiles([a, b])
    assert e.value.field == f"{b}:2"
    assert e.value.value == "a100"


def test_mixed_models_unless_filtered(tmp_path: Path) -> None:
    a = ours(tmp_path / "a.csv", [{"op": "act", "num_tokens": 8, "time_ms": 1}])
    b = ours(tmp_path / "b.csv", [{"op": "act", "num_tokens": 16, "time_ms": 2, "model": "big"}])
    with pytest.raises(ProfileError, match="several models") as e:
        read_profiles([a, b])
    assert e.value.field == "model"
    ps = read_profiles([a, b], model="big")
    assert ps.model == "big"
    assert ps.ops["act"].features.tolist() == [[16.0]]


def test_nothing_left_after_filtering(tmp_path: Path, vidur_dir: Path) -> None:
    with pytest.raises(ProfileError, match=r"tensor_parallel_size=8.*present: 1, 2") as e:
        read_profiles(
            [vidur_dir / "mlp.csv", vidur_dir / "attention.csv.xz"], tensor_parallel_size=8
        )
    assert e.value.field == "tensor_parallel_size"
    a = ours(tmp_path / "a.csv", [{"op": "act", "num_tokens": 8, "time_ms": 1}])
    with pytest.raises(ProfileError, match=r"model='llama-2-7b'.*'tiny'") as e:
        read_profiles([a], model="llama-2-7b")
    assert e.value.field == "model"
    assert e.value.value == "llama-2-7b"


def test_unknown_format_and_empty_inputs(tmp_path: Path) -> None:
    path = write_vidur(tmp_path / "x.csv", ["a", "b"], [[1, 2]])
    with pytest.raises(ProfileError, match="unknown profile format") as e:
        read_profiles([path])
    assert e.value.field == str(path)
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(ProfileError, match="no profile files"):
        read_profiles([empty])
    with pytest.raises(ProfileError, match="no such file"):
        read_profiles([tmp_path / "missing.csv"])
    bad_xz = tmp_path / "p.csv.xz"
    bad_xz.write_bytes(b"not xz")
    with pytest.raises(ProfileError, match="cannot read") as e:
        read_profiles([bad_xz])
    assert e.value.field == str(bad_xz)


def test_ragged_row(tmp_path: Path) -> None:
    path = tmp_path / "p.csv"
    path.write_text(",".join(OUR_COLUMNS) + "\nqkv_proj,8\n")
    with pytest.raises(ProfileError, match="2 cells") as e:
        read_profiles([path])
    assert e.value.field == f"{path}:2"


# --- digest --------------------------------------------------------------------------------


def test_digest_is_order_independent_and_tracks_times(tmp_path: Path, vidur_dir: Path) -> None:
    files = sorted(p for p in vidur_dir.iterdir() if p.name != "cpu_overheads.csv")
    d1 = read_profiles(files).digest()
    assert read_profiles(list(reversed(files))).digest() == d1
    assert read_profiles([vidur_dir]).digest() == d1
    assert len(d1) == 64
    rows = [mlp_row(0, 128, 1, 0.02), mlp_row(1, 64, 1, 0.01)]  # same samples, rows swapped
    write_vidur(vidur_dir / "mlp.csv", MLP_HEADER, rows)
    assert read_profiles([vidur_dir]).digest() == d1
    rows[0][MLP_HEADER.index("time_stats.mlp_act.median")] = 0.5
    write_vidur(vidur_dir / "mlp.csv", MLP_HEADER, rows)
    assert read_profiles([vidur_dir]).digest() != d1


def test_contract_names() -> None:
    assert set(FEATURES) == set(OPS)
    assert FEATURES["attn_prefill"] == ("num_tokens", "mean_context")
    assert FEATURES["attn_decode"] == ("batch_size", "mean_context")
    assert FEATURES["all_reduce"] == FEATURES["send_recv"] == ("num_bytes",)
    assert FEATURES["residual_add"] == ("num_tokens",)
    assert np.float64(1).dtype == np.float64
