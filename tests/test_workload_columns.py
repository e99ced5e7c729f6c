"""``format = "columns"``: any CSV/TSV/JSON-lines trace read through a column mapping and
row filters (``ColumnTrace``), its errors, and a simulation on such a trace."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from column_traces import (
    BURST_COLUMNS,
    BURST_HEADER,
    BURST_ROWS,
    SHARED_TRACES,
    burst,
    jsonl,
    load,
    read,
    spec,
    write,
)

from tokenyard._checks import toml_module
from tokenyard.cli import main
from tokenyard.errors import ConfigError
from tokenyard.workload import (
    AzureTrace,
    ColumnFilter,
    ColumnTrace,
    MooncakeTrace,
    TraceColumns,
    TraceError,
    VidurTrace,
    load_workload,
    sample_path,
    summarize,
)
from tokenyard.workload.chunk import concat

# --- reading ----------------------------------------------------------------------------------


def test_burstgpt_csv_with_a_model_filter(tmp_path: Path) -> None:
    reader = load(
        burst(tmp_path), filter={"column": "Model", "equals": "ChatGPT"}, zero_output="skip"
    )
    assert reader.hash_block_size is None
    chunk = read(reader)
    # ChatGPT rows at 5, 118, 130 (0 output tokens: skipped) and 140.5, shifted to start at 0.
    assert chunk.arrived_at.tolist() == [0.0, 113.0, 135.5]
    assert chunk.num_prefill_tokens.tolist() == [472, 417, 20]
    assert chunk.num_decode_tokens.tolist() == [18, 10, 7]
    assert chunk.hash_ids is None
    stats = summarize(reader)
    assert (stats.num_requests, stats.duration_s) == (3, 135.5)


def test_filters_in_not_in_and_several_at_once(tmp_path: Path) -> None:
    path = burst(tmp_path)
    gpt4 = load(path, filter={"column": "Model", "in": ["GPT-4", "Claude"]}, zero_output="skip")
    assert read(gpt4).num_prefill_tokens.tolist() == [88]  # 1087 has 0 output tokens
    both = [
        {"column": "Model", "equals": "ChatGPT"},
        {"column": "Log Type", "not_in": ["API log"]},
    ]
    chat = read(load(path, filter=both, zero_output="clamp"))
    assert chat.num_prefill_tokens.tolist() == [472, 1360, 20]
    assert chat.num_decode_tokens.tolist() == [18, 1, 7]
    assert chat.arrived_at.tolist() == [0.0, 125.0, 135.5]


def test_filtered_out_rows_are_not_parsed(tmp_path: Path) -> None:
    text = BURST_HEADER + "0,ChatGPT,5,1,6,x\n1,other,n/a,-3,?,x\n2,ChatGPT,6,2,8,x\n"
    reader = load(write(tmp_path, "t.csv", text), filter={"column": "Model", "equals": "ChatGPT"})
    assert read(reader).num_prefill_tokens.tolist() == [5, 6]


def test_csv_filter_values_compare_as_text(tmp_path: Path) -> None:
    text = "t,in,out,tenant\n0,5,1,7\n1,6,1, 8\n2,7,1,9\n"
    columns = {"time": "t", "time_unit": "s", "input_tokens": "in", "output_tokens": "out"}
    path = write(tmp_path, "t.csv", text)
    reader = load(path, columns, filter={"column": "tenant", "in": [7, "8"]})
    assert read(reader).num_prefill_tokens.tolist() == [5, 6]


def test_jsonl_millisecond_epoch_timestamps(tmp_path: Path) -> None:
    rows: list[object] = [
        {"ts_ms": 1_700_000_000_000, "prompt_len": 100, "gen_len": 5, "tenant": "a"},
        {"ts_ms": 1_700_000_000_250, "prompt_len": 200, "gen_len": 6, "tenant": "b"},
        "",
        {"ts_ms": 1_700_000_003_000.0, "prompt_len": 300.0, "gen_len": 7, "tenant": "a"},
    ]
    columns = {"time": "ts_ms", "time_unit": "ms", "input_tokens": "prompt_len"}
    columns["output_tokens"] = "gen_len"
    chunk = read(load(jsonl(tmp_path, rows), columns))
    assert chunk.arrived_at.tolist() == [0.0, 0.25, 3.0]
    assert chunk.num_prefill_tokens.tolist() == [100, 200, 300]
    only_a = read(load(jsonl(tmp_path, rows), columns, filter={"column": "tenant", "equals": "a"}))
    assert only_a.arrived_at.tolist() == [0.0, 3.0]


def test_jsonl_filter_values_must_match_the_type(tmp_path: Path) -> None:
    rows: list[object] = [
        {"t": i, "p": 10 + i, "o": 1, "tier": tier} for i, tier in enumerate([1, "1", True])
    ]
    columns = {"time": "t", "time_unit": "s", "input_tokens": "p", "output_tokens": "o"}
    chunk = read(load(jsonl(tmp_path, rows), columns, filter={"column": "tier", "equals": 1}))
    assert chunk.num_prefill_tokens.tolist() == [10]


@pytest.mark.parametrize(
    ("unit", "stamps", "expected"),
    [
        ("s", ["100", "100.5", "103"], [0.0, 0.5, 3.0]),
        ("ms", ["7", "257", "1007"], [0.0, 0.25, 1.0]),
        ("us", ["1000000", "1250000", "3000000"], [0.0, 0.25, 2.0]),
        # Integer nanoseconds since 1970: exact relative to the first row (float64 seconds
        # since 1970 would be off by up to ~0.2 us).
        (
            "ns",
            ["1700000000000000001", "1700000000000000002", "1700000001000000003"],
            [0.0, 1e-9, 1.000000002],
        ),
    ],
)
def test_numeric_time_units(
    tmp_path: Path, unit: str, stamps: list[str], expected: list[float]
) -> None:
    text = "t,in,out\n" + "".join(f"{s},5,1\n" for s in stamps)
    columns = {"time": "t", "time_unit": unit, "input_tokens": "in", "output_tokens": "out"}
    chunk = read(load(write(tmp_path, "t.csv", text), columns))
    assert chunk.arrived_at.tolist() == expected


def test_datetime_strings(tmp_path: Path) -> None:
    rows: list[object] = [
        {"at": "2024-05-01T23:59:59.5Z", "in": 3, "out": 1},
        {"at": "2024-05-02T00:00:00.75Z", "in": 4, "out": 1},
        {"at": "2024-05-02 02:00:01+02:00", "in": 5, "out": 1},
        {"at": "2024-05-02T00:00:02.1234567", "in": 6, "out": 1},
    ]
    columns = {"time": "at", "time_unit": "datetime", "input_tokens": "in", "output_tokens": "out"}
    chunk = read(load(jsonl(tmp_path, rows), columns))
    # float64 seconds since the first day's midnight (~86,400): ~1e-11 s resolution.
    np.testing.assert_allclose(chunk.arrived_at, [0.0, 1.25, 1.5, 2.6234567], rtol=0, atol=1e-9)


def test_gaps_add_up_including_filtered_rows(tmp_path: Path) -> None:
    text = "delta_ms,tenant,in,out\n900,a,5,1\n100,b,6,1\n250,a,7,1\n0,a,8,1\n"
    columns = {"gap": "delta_ms", "time_unit": "ms", "input_tokens": "in", "output_tokens": "out"}
    path = write(tmp_path, "t.csv", text)
    # The first row's gap (from before the trace) is shifted away like any first time.
    all_rows = read(load(path, columns)).arrived_at
    np.testing.assert_allclose(all_rows, [0.0, 0.1, 0.35, 0.35], rtol=0, atol=1e-12)
    only_a = read(load(path, columns, filter={"column": "tenant", "equals": "a"}))
    np.testing.assert_allclose(only_a.arrived_at, [0.0, 0.35, 0.35], rtol=0, atol=1e-12)


def test_tsv_and_explicit_file_format(tmp_path: Path) -> None:
    text = BURST_HEADER.replace(",", "\t") + "".join(
        r.replace(",", "\t") + "\n" for r in BURST_ROWS
    )
    tsv = read(load(write(tmp_path, "b.tsv", text), zero_output="clamp"))
    csv = read(load(burst(tmp_path, "b.log"), zero_output="clamp", file_format="csv"))
    np.testing.assert_array_equal(tsv.arrived_at, csv.arrived_at)
    np.testing.assert_array_equal(tsv.num_decode_tokens, csv.num_decode_tokens)
    assert len(csv) == len(BURST_ROWS)


def test_gzip_files(tmp_path: Path) -> None:
    plain = read(load(burst(tmp_path), zero_output="skip"))
    packed = read(load(burst(tmp_path, "b.csv.gz"), zero_output="skip"))
    np.testing.assert_array_equal(plain.arrived_at, packed.arrived_at)
    rows: list[object] = [{"t": 1, "p": 5, "o": 2}, {"t": 2, "p": 6, "o": 3}]
    columns = {"time": "t", "time_unit": "s", "input_tokens": "p", "output_tokens": "o"}
    chunk = read(load(jsonl(tmp_path, rows, "x.ndjson.gz"), columns))
    assert chunk.num_decode_tokens.tolist() == [2, 3]


def test_hash_ids_from_json_lines_and_csv_cells(tmp_path: Path) -> None:
    rows: list[object] = [
        {"t": 0, "p": 40, "o": 1, "blocks": [7, 8, 9]},
        {"t": 1, "p": 16, "o": 1, "blocks": []},
        {"t": 2, "p": 17, "o": 1, "blocks": None},
        {"t": 3, "p": 33, "o": 1, "blocks": [7, 8]},
    ]
    columns = {"time": "t", "time_unit": "s", "input_tokens": "p", "output_tokens": "o"}
    columns["hash_ids"] = "blocks"
    reader = load(jsonl(tmp_path, rows), columns, hash_block_size=16)
    assert reader.hash_block_size == 16
    chunk = read(reader)
    assert chunk.hash_offsets is not None
    assert chunk.hash_ids is not None
    assert chunk.hash_offsets.tolist() == [0, 3, 3, 3, 5]
    assert chunk.hash_ids.tolist() == [7, 8, 9, 7, 8]
    text = 't,p,o,blocks\n0,40,1,"[7, 8, 9]"\n1,16,1,\n2,17,1,[]\n3,33,1,"[7,8]"\n'
    again = read(load(write(tmp_path, "h.csv", text), columns, hash_block_size=16))
    np.testing.assert_array_equal(again.hash_offsets, chunk.hash_offsets)
    np.testing.assert_array_equal(again.hash_ids, chunk.hash_ids)


@pytest.mark.parametrize("chunk_size", [1, 2, 3, 5])
def test_small_chunks_equal_one_big_chunk(tmp_path: Path, chunk_size: int) -> None:
    text = "t,p,o,blocks\n" + "".join(
        f'{i * 0.5},{20 + i},{1 + i},"[{i % 3}, {i}]"\n' for i in range(11)
    )
    columns = {"time": "t", "time_unit": "s", "input_tokens": "p", "output_tokens": "o"}
    columns["hash_ids"] = "blocks"
    reader = load(write(tmp_path, "t.csv", text), columns, hash_block_size=16)
    whole = read(reader)
    chunks = list(reader.chunks(chunk_size))
    assert [len(c) for c in chunks[:-1]] == [chunk_size] * (len(chunks) - 1)
    again = concat(chunks)
    for name in (
        "arrived_at",
        "num_prefill_tokens",
        "num_decode_tokens",
        "hash_offsets",
        "hash_ids",
    ):
        np.testing.assert_array_equal(getattr(again, name), getattr(whole, name))


def test_pipeline_options_apply(tmp_path: Path) -> None:
    path = burst(tmp_path)
    chunk = read(load(path, zero_output="clamp", start_offset_s=100.0, limit=3, time_scale=2.0))
    assert chunk.arrived_at.tolist() == [0.0, 24.0, 26.0]  # rows at 118, 130, 131
    stats = load(path, zero_output="clamp", target_qps=1.0).validate()
    assert stats.mean_qps == pytest.approx(1.0, rel=1e-12)


@pytest.mark.parametrize(
    ("fmt", "columns", "options"),
    [
        (
            "vidur",
            {
                "time": "arrived_at",
                "time_unit": "s",
                "input_tokens": "num_prefill_tokens",
                "output_tokens": "num_decode_tokens",
            },
            {},
        ),
        (
            "mooncake",
            {
                "time": "timestamp",
                "time_unit": "ms",
                "input_tokens": "input_length",
                "output_tokens": "output_length",
                "hash_ids": "hash_ids",
            },
            {"hash_block_size": 512},
        ),
        (
            "azure",
            {
                "time": "TIMESTAMP",
                "time_unit": "datetime",
                "input_tokens": "ContextTokens",
                "output_tokens": "GeneratedTokens",
            },
            {},
        ),
    ],
)
def test_a_mapping_reads_the_samples_like_their_own_readers(
    fmt: str, columns: dict[str, str], options: dict[str, object]
) -> None:
    path = sample_path(fmt)
    builtin = {"vidur": VidurTrace, "mooncake": MooncakeTrace, "azure": AzureTrace}[fmt]
    expected = read(builtin(path, zero_output="clamp"))
    got = read(load(path, columns, zero_output="clamp", **options))
    for name in (
        "arrived_at",
        "num_prefill_tokens",
        "num_decode_tokens",
        "hash_offsets",
        "hash_ids",
    ):
        np.testing.assert_array_equal(getattr(got, name), getattr(expected, name))


@pytest.mark.parametrize(
    ("relative", "builtin", "columns", "options"),
    [
        (
            "azure/AzureLLMInferenceTrace_conv.csv",
            AzureTrace,
            {
                "time": "TIMESTAMP",
                "time_unit": "datetime",
                "input_tokens": "ContextTokens",
                "output_tokens": "GeneratedTokens",
            },
            {"zero_output": "skip"},
        ),
        (
            "mooncake/conversation_trace.jsonl",
            MooncakeTrace,
            {
                "time": "timestamp",
                "time_unit": "ms",
                "input_tokens": "input_length",
                "output_tokens": "output_length",
                "hash_ids": "hash_ids",
            },
            {"hash_block_size": 512},
        ),
    ],
)
def test_a_mapping_reads_the_shared_traces_like_their_own_readers(
    relative: str, builtin: Any, columns: dict[str, str], options: dict[str, object]
) -> None:
    path = SHARED_TRACES / relative
    if not path.is_file():
        pytest.skip(f"{path} is absent (../shared/data is not checked out)")
    reader_options = {k: v for k, v in options.items() if k != "hash_block_size"}
    expected = read(builtin(path, **reader_options))
    got = read(load(path, columns, **options))
    assert len(got) > 10_000
    for name in (
        "arrived_at",
        "num_prefill_tokens",
        "num_decode_tokens",
        "hash_offsets",
        "hash_ids",
    ):
        np.testing.assert_array_equal(getattr(got, name), getattr(expected, name))


def test_describe_round_trips(tmp_path: Path) -> None:
    columns = {**BURST_COLUMNS, "hash_ids": "Total tokens"}  # any column, to round-trip it
    filters = [
        {"column": "Model", "equals": "ChatGPT"},
        {"column": "Log Type", "not_in": ["API log", "x"]},
        {"column": "Model", "in": ["ChatGPT", 4]},
    ]
    reader = load(
        burst(tmp_path, "b.txt"),
        columns,
        filter=filters,
        file_format="csv",
        hash_block_size=8,
        limit=2,
        zero_output="skip",
    )
    described = reader.describe()
    json.dumps(described)
    assert described["format"] == "columns"
    assert described["columns"] == columns
    assert described["filter"] == filters
    assert load_workload(described) == reader
    assert load_workload(described).describe() == described
    plain = load(burst(tmp_path))
    assert "filter" not in plain.describe()
    assert load_workload(plain.describe()) == plain


def test_the_python_constructor(tmp_path: Path) -> None:
    reader = ColumnTrace(
        str(burst(tmp_path)),
        columns=TraceColumns(**BURST_COLUMNS),  # type: ignore[arg-type]
        filter=(ColumnFilter("Model", values=("GPT-4",), exclude=True),),
        zero_output="clamp",
    )
    assert read(reader).num_prefill_tokens.tolist() == [472, 417, 1360, 20]
    assert reader == load(
        burst(tmp_path), filter={"column": "Model", "not_in": ["GPT-4"]}, zero_output="clamp"
    )


# --- a simulation -------------------------------------------------------------------------------

CONFIG = """
seed = 3
[cluster]
num_replicas = 2
[replica.scheduler]
policy = "sarathi"
[workload]
kind = "trace"
format = "columns"
path = "burstgpt.csv"
zero_output = "skip"
[workload.columns]
time = "Timestamp"
time_unit = "s"
input_tokens = "Request tokens"
output_tokens = "Response tokens"
[workload.filter]
column = "Model"
equals = "ChatGPT"
"""


def test_simulate_a_mapped_trace_from_a_config(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    rows = [
        f"{i * 0.25:.2f},{'GPT-4' if i % 4 == 0 else 'ChatGPT'},{50 + i % 97},{i % 9},0,x"
        for i in range(400)
    ]
    write(tmp_path, "burstgpt.csv", BURST_HEADER + "".join(r + "\n" for r in rows))
    config = tmp_path / "burst.toml"
    config.write_text(CONFIG)
    out = tmp_path / "out"
    assert main(["simulate", str(config), "--no-progress", "--output", str(out)]) == 0
    assert "requests" in capsys.readouterr().out
    summary = json.loads((out / "summary.json").read_text())
    # 300 ChatGPT rows, of which those with i % 9 == 0 (0 output tokens) are skipped.
    kept = sum(1 for i in range(400) if i % 4 and i % 9)
    assert summary["num_requests"] == kept
    written = summary["config"]["workload"]
    assert written["format"] == "columns"
    assert written["filter"] == [{"column": "Model", "equals": "ChatGPT"}]


def test_simulate_names_a_bad_mapping_key(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    burst(tmp_path)
    config = tmp_path / "burst.toml"
    config.write_text(CONFIG.replace('time_unit = "s"', 'time_unit = "seconds"'))
    assert main(["simulate", str(config), "--no-progress"]) == 2
    assert "workload.columns.time_unit: unknown value 'seconds'" in capsys.readouterr().err


def test_trace_flag_keeps_the_configs_mapping(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    config = tmp_path / "burst.toml"
    config.write_text(CONFIG)
    other = burst(tmp_path, "other.csv")
    assert main(["simulate", str(config), "--trace", str(other), "--json", "--no-progress"]) == 0
    summary = json.loads(capsys.readouterr().out)
    assert summary["num_requests"] == 3  # BURST_ROWS: ChatGPT with output tokens
    assert summary["config"]["workload"]["columns"]["time"] == "Timestamp"


def test_the_docs_burstgpt_config_loads(tmp_path: Path) -> None:
    docs = Path(__file__).resolve().parents[1] / "docs" / "workloads.md"
    blocks = re.findall(r"```toml\n(.*?)```", docs.read_text(), re.DOTALL)
    (block,) = [b for b in blocks if 'format = "columns"' in b]
    workload = toml_module().loads(block)["workload"]
    rows = [*BURST_ROWS, "150,ChatGPT,33,4,37,Conversation log"]
    write(tmp_path, workload["path"], BURST_HEADER + "".join(r + "\n" for r in rows))
    chunk = read(load_workload(workload, base_dir=tmp_path))
    assert chunk.num_prefill_tokens.tolist() == [472, 20, 33]  # ChatGPT conversations
    assert chunk.arrived_at.tolist() == [0.0, 135.5, 145.0]


def test_a_lora_column_gives_each_request_its_adapter(tmp_path: Path) -> None:
    path = write(
        tmp_path,
        "lora.csv",
        "t,in,out,adapter\n0,10,2,3\n1,10,2,\n2,10,2,-1\n3,10,2, 0 \n",
    )
    columns = {"time": "t", "time_unit": "s", "input_tokens": "in", "output_tokens": "out"}
    chunk = next(iter(load_workload(spec(path, {**columns, "lora": "adapter"})).chunks()))
    assert chunk.lora_ids is not None
    assert list(chunk.lora_ids) == [3, -1, -1, 0]
    assert next(iter(load_workload(spec(path, columns)).chunks())).lora_ids is None
    rows = [{"t": 0, "in": 5, "out": 1, "a": 7}, {"t": 1, "in": 5, "out": 1, "a": None}]
    json_chunk = next(
        iter(load_workload(spec(jsonl(tmp_path, rows), {**columns, "lora": "a"})).chunks())
    )
    assert json_chunk.lora_ids is not None
    assert list(json_chunk.lora_ids) == [7, -1]


@pytest.mark.parametrize("bad", ["x", "1.5", "-2"])
def test_a_bad_adapter_id_names_the_file_line_and_column(tmp_path: Path, bad: str) -> None:
    path = write(tmp_path, "bad.csv", f"t,in,out,adapter\n0,10,2,1\n1,10,2,{bad}\n")
    columns = {"time": "t", "time_unit": "s", "input_tokens": "in", "output_tokens": "out"}
    with pytest.raises(TraceError) as caught:
        list(load_workload(spec(path, {**columns, "lora": "adapter"})).chunks())
    assert (caught.value.line, caught.value.field) == (3, "adapter")


def test_a_trace_with_an_adapter_column_runs_lora_in_the_simulator(tmp_path: Path) -> None:
    from tokenyard.simulation import config_from_mapping, simulate

    rows = "".join(f"{i * 0.05},{200 + i},{20},{i % 3 if i % 4 else ''}\n" for i in range(40))
    path = write(tmp_path, "lora.csv", "t,in,out,adapter\n" + rows)
    columns = {"time": "t", "time_unit": "s", "input_tokens": "in", "output_tokens": "out"}
    workload = spec(path, {**columns, "lora": "adapter"})
    result = simulate(
        config_from_mapping({"workload": workload, "replica": {"lora": {"max_loras": 2}}})
    )
    assert result.summary["num_requests"] == 40
    assert result.summary["lora"]["adapter_loads"] >= 3
    with pytest.raises(ConfigError, match=r"replica\.lora"):
        config_from_mapping({"workload": workload})


def test_a_popularity_model_and_an_adapter_column_are_not_both_taken(tmp_path: Path) -> None:
    path = write(tmp_path, "lora.csv", "t,in,out,adapter\n0,10,2,1\n")
    columns = {"time": "t", "time_unit": "s", "input_tokens": "in", "output_tokens": "out"}
    with pytest.raises(ConfigError) as caught:
        load_workload({**spec(path, {**columns, "lora": "adapter"}), "lora": {"num_adapters": 2}})
    assert caught.value.field == "workload.lora"
