"""Tests of the dataset readers: the presets on the shared files, strict validation with errors that
name the file and line, field mapping, parquet and hub loading (with stand-in modules, since
neither pyarrow nor datasets is a dependency), and the data-directory resolution."""

import json
import sys
import types

import pytest

from gdro_jax import data


def write_jsonl(path, records):
    path.write_text("".join(json.dumps(record) + "\n" for record in records), encoding="utf-8")
    return path


# ---- presets on the shared files ------------------------------------------------------------


@pytest.mark.parametrize("name", sorted(data.PRESETS))
def test_preset_loads_every_row_of_its_file(name, data_dir):
    preset = data.PRESETS[name]
    path = data_dir / preset.filename
    # Reference: the file's non-blank lines, counted without the reader.
    with open(path, encoding="utf-8") as file:
        raw = [json.loads(line) for line in file if line.strip()]
    rows = data.load_preset(name, data_dir)
    assert len(rows) == len(raw) == preset.num_rows
    assert len({row["id"] for row in rows}) == len(rows)
    for row, record in zip(rows, raw, strict=True):
        assert row["problem"] == record["problem"] and row["problem"].strip()
        assert row["answer"] == str(record["answer"]) and row["answer"].strip()
        assert row["prompt"] == record["problem"] + " " + data.PROMPT_SUFFIX
        assert row["id"] == str(record[preset.fields.id])


def test_preset_finds_the_default_data_dir(data_dir):
    rows = data.load_preset("aime25")
    assert [row["id"] for row in rows] == [
        row["id"] for row in data.load_preset("aime25", data_dir)
    ]


def test_preset_row_count_is_checked(tmp_path, data_dir):
    lines = (data_dir / "math500.jsonl").read_text(encoding="utf-8").splitlines()[:3]
    (tmp_path / "math500.jsonl").write_text("\n".join(lines) + "\n", encoding="utf-8")
    with pytest.raises(data.DataFormatError, match=r"math500\.jsonl.*expected 500 rows.*found 3"):
        data.load_preset("math500", tmp_path)


def test_preset_argument_errors(tmp_path):
    with pytest.raises(ValueError, match="name='gsm8k'"):
        data.load_preset("gsm8k", tmp_path)
    with pytest.raises(ValueError, match="source='s3'"):
        data.load_preset("math500", tmp_path, source="s3")
    with pytest.raises(ValueError, match="name='aime24' has no hub source"):
        data.load_preset("aime24", tmp_path, source="hub")
    with pytest.raises(FileNotFoundError, match="math500.jsonl"):
        data.load_preset("math500", tmp_path)
    with pytest.raises(FileNotFoundError, match="data_dir="):
        data.load_preset("math500", tmp_path / "absent")


# ---- malformed files --------------------------------------------------------------------------

GOOD = b'{"id": 1, "problem": "1+1?", "answer": "2"}\n'
MALFORMED = {
    "missing_answer": (GOOD + b'{"id": 2, "problem": "2+2?"}\n', 2, "missing answer field"),
    "missing_prompt": (GOOD + b'{"id": 2, "answer": "4"}\n', 2, "missing prompt field"),
    "missing_id": (GOOD + b'{"problem": "2+2?", "answer": "4"}\n', 2, "missing id field"),
    "empty_answer": (GOOD + b'{"id": 2, "problem": "2+2?", "answer": "  "}\n', 2, "empty answer"),
    "empty_prompt": (b'{"id": 2, "problem": "", "answer": "4"}\n', 1, "empty prompt"),
    "null_answer": (GOOD + b'{"id": 2, "problem": "x", "answer": null}\n', 2, "must be a string"),
    "bool_id": (GOOD + b'{"id": true, "problem": "x", "answer": "4"}\n', 2, "string or integer"),
    "bad_json": (
        GOOD + GOOD.replace(b"1", b"3") + b'{"id": 2, "problem": "x",\n',
        3,
        "invalid JSON",
    ),
    "not_utf8": (GOOD + b'{"id": 2, "problem": "\xff\xfe", "answer": "4"}\n', 2, "not valid UTF-8"),
    "not_object": (GOOD + b"[1, 2]\n", 2, "expected a JSON object"),
    "duplicate_id": (GOOD + b"\n" + GOOD, 3, r"duplicate id '1' \(first used at .*:line 1\)"),
}


@pytest.mark.parametrize("case", sorted(MALFORMED))
def test_malformed_row_names_file_and_line(case, tmp_path):
    content, line, message = MALFORMED[case]
    path = tmp_path / f"{case}.jsonl"
    path.write_bytes(content)
    with pytest.raises(data.DataFormatError, match=message) as error:
        data.read_rows(path)
    assert str(error.value).startswith(f"{path}:line {line}: ")
    assert error.value.source == str(path) and error.value.location == f"line {line}"


@pytest.mark.parametrize("content", [b"", b"\n  \n"])
def test_empty_file_names_the_file(content, tmp_path):
    path = tmp_path / "empty.jsonl"
    path.write_bytes(content)
    with pytest.raises(data.DataFormatError, match="has no rows") as error:
        data.read_jsonl(path)
    assert str(error.value).startswith(str(path))


def test_read_rows_rejects_unknown_suffix_and_missing_file(tmp_path):
    path = write_jsonl(tmp_path / "rows.json", [{"id": 1, "problem": "p", "answer": "a"}])
    with pytest.raises(ValueError, match=r"rows\.json.*\.jsonl or \.parquet"):
        data.read_rows(path)
    with pytest.raises(FileNotFoundError, match="absent.jsonl"):
        data.read_rows(tmp_path / "absent.jsonl")


# ---- field mapping ----------------------------------------------------------------------------


def test_field_names_dotted_paths_positions_and_extras(tmp_path):
    records = [
        {
            "prompt": [{"role": "user", "content": f"question {i}"}],
            "reward_model": {"ground_truth": 10 + i},
            "data_source": "dapo",
            "id": "ignored, not the id field",
        }
        for i in range(3)
    ]
    path = write_jsonl(tmp_path / "verl.jsonl", records)
    fields = data.FieldNames(prompt="prompt.0.content", answer="reward_model.ground_truth", id=None)
    rows = data.read_rows(path, fields=fields)
    assert rows == [
        {"id": str(i), "prompt": f"question {i}", "answer": str(10 + i), "data_source": "dapo"}
        for i in range(3)
    ]


def test_blank_lines_are_skipped_and_line_numbers_count_them(tmp_path):
    path = tmp_path / "blank.jsonl"
    path.write_bytes(GOOD + b"\n\n" + b'{"id": 2, "problem": "x"}\n')
    with pytest.raises(data.DataFormatError, match=r":line 4: missing answer"):
        data.read_jsonl(path)


# ---- parquet and hub, through stand-in modules ------------------------------------------------


class FakeTable:
    def __init__(self, records):
        self.records = records

    def to_pylist(self):
        return self.records


def install_fake_pyarrow(monkeypatch, records):
    parquet = types.ModuleType("pyarrow.parquet")
    parquet.read_table = lambda path: FakeTable(records)
    pyarrow = types.ModuleType("pyarrow")
    pyarrow.parquet = parquet
    monkeypatch.setitem(sys.modules, "pyarrow", pyarrow)
    monkeypatch.setitem(sys.modules, "pyarrow.parquet", parquet)


def test_parquet_rows_are_validated_like_jsonl(monkeypatch, tmp_path):
    path = tmp_path / "train.parquet"
    path.write_bytes(b"PAR1")
    records = [{"prompt": "p0", "solution": "1"}, {"prompt": "p1", "solution": "2"}]
    install_fake_pyarrow(monkeypatch, records)
    fields = data.FieldNames(prompt="prompt", answer="solution", id=None)
    rows = data.read_rows(path, fields=fields)
    assert rows == [
        {"id": "0", "prompt": "p0", "answer": "1"},
        {"id": "1", "prompt": "p1", "answer": "2"},
    ]
    install_fake_pyarrow(monkeypatch, records + [{"prompt": "p2", "solution": ""}])
    with pytest.raises(data.DataFormatError, match=rf"^{path}:row 2: empty answer"):
        data.read_parquet(path, fields=fields)


def test_parquet_without_pyarrow_says_what_to_install(monkeypatch, tmp_path):
    monkeypatch.setitem(sys.modules, "pyarrow", None)
    monkeypatch.setitem(sys.modules, "pyarrow.parquet", None)
    path = tmp_path / "train.parquet"
    path.write_bytes(b"PAR1")
    with pytest.raises(ImportError, match=r"train\.parquet needs pyarrow.*pip install pyarrow"):
        data.read_rows(path)


def test_hub_without_datasets_says_what_to_install(monkeypatch, tmp_path):
    monkeypatch.setitem(sys.modules, "datasets", None)
    with pytest.raises(ImportError, match=r"needs the `datasets` package.*pip install datasets"):
        data.load_preset("dapo_math_en", tmp_path, source="hub")


def test_hub_preset_loads_through_datasets(monkeypatch, tmp_path):
    calls = []
    records = [{"prompt": f"problem {i}", "solution": str(i)} for i in range(4)]

    def load_dataset(name, config, *, split, revision):
        calls.append((name, config, split, revision))
        return records

    monkeypatch.setitem(sys.modules, "datasets", types.SimpleNamespace(load_dataset=load_dataset))
    rows = data.load_preset("dapo_math_en", tmp_path, source="hub", suffix=None)
    assert calls == [("open-r1/DAPO-Math-17k-Processed", "en", "train", None)]
    assert [(row["id"], row["prompt"], row["answer"]) for row in rows] == [
        (str(i), f"problem {i}", str(i)) for i in range(4)
    ]
    records.append({"prompt": "problem 4"})
    with pytest.raises(data.DataFormatError, match=r"^hub:open-r1/DAPO-Math-17k-Processed\[en\]"):
        data.load_preset("dapo_math_en", tmp_path, source="hub")


# ---- data directory ---------------------------------------------------------------------------


def test_data_dir_environment_variable_wins(monkeypatch, tmp_path):
    monkeypatch.setenv(data.DATA_DIR_ENV, str(tmp_path))
    assert data.data_dir_candidates() == [tmp_path]
    assert data.default_data_dir() == tmp_path
    assert data.resolve_data_dir() == tmp_path
    monkeypatch.setenv(data.DATA_DIR_ENV, str(tmp_path / "absent"))
    assert data.default_data_dir() is None
    with pytest.raises(FileNotFoundError, match=rf"tried {tmp_path / 'absent'}.*GDRO_DATA_DIR"):
        data.resolve_data_dir()


def test_data_dir_falls_back_to_shared_data_beside_the_working_directory(monkeypatch, tmp_path):
    monkeypatch.delenv(data.DATA_DIR_ENV, raising=False)
    work = tmp_path / "work" / "main"
    shared = tmp_path / "work" / "shared" / "data"
    work.mkdir(parents=True)
    shared.mkdir(parents=True)
    monkeypatch.chdir(work)
    assert data.data_dir_candidates()[0] == shared.resolve()
    assert data.default_data_dir() == shared.resolve()
