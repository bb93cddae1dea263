"""Metrics to disk: JSONL rows and TensorBoard event files."""

import glob
import json
import math
import struct
import time

import numpy as np

from gdro_jax import train


def test_writer_appends_one_json_object_per_step_and_tensorboard_events(tmp_path):
    with train.MetricsWriter(tmp_path) as writer:
        writer.write(1, {"reward": np.float32(0.25), "bin/q": np.array([0.5, 0.5, 0.0])})
        writer.write(2, {"reward": np.float32(np.nan), "bin/q": np.array([1.0, 0.0, 0.0])})
    lines = (tmp_path / "metrics.jsonl").read_text().splitlines()
    assert len(lines) == 2
    first, second = (json.loads(line) for line in lines)
    assert first == {"step": 1, "reward": 0.25, "bin/q": [0.5, 0.5, 0.0]}
    assert second["reward"] == "nan" and math.isnan(float(second["reward"]))
    assert train.read_metrics(tmp_path / "metrics.jsonl")[1]["bin/q"] == [1.0, 0.0, 0.0]
    events = glob.glob(str(tmp_path / "tb" / "events.out.tfevents.*"))
    assert len(events) == 1

    scalars = _read_scalars(events[0])
    assert scalars["bin/q/1"] == [(1, 0.5), (2, 0.0)]
    assert scalars["reward"][0] == (1, 0.25)


def _read_scalars(path):
    """Reads (step, value) pairs per tag from a TensorBoard event file (TFRecord framing)."""
    from tensorboardX.proto import event_pb2

    scalars = {}
    with open(path, "rb") as file:
        while header := file.read(12):
            (length,) = struct.unpack("<Q", header[:8])
            event = event_pb2.Event.FromString(file.read(length))
            file.read(4)  # the data's checksum
            for value in event.summary.value:
                scalars.setdefault(value.tag, []).append((event.step, value.simple_value))
    return scalars


def test_writer_appends_to_an_existing_file(tmp_path):
    with train.MetricsWriter(tmp_path, tensorboard=False) as writer:
        writer.write(1, {"reward": 1.0})
    with train.MetricsWriter(tmp_path, tensorboard=False) as writer:
        writer.write(2, {"reward": 2.0})
    assert [row["step"] for row in train.read_metrics(tmp_path / "metrics.jsonl")] == [1, 2]


def test_a_new_run_starts_the_file_afresh(tmp_path):
    with train.MetricsWriter(tmp_path, tensorboard=False) as writer:
        writer.write(1, {"reward": 1.0})
    with train.MetricsWriter(tmp_path, tensorboard=False, append=False) as writer:
        writer.write(1, {"reward": 3.0})
    rows = train.read_metrics(tmp_path / "metrics.jsonl")
    assert [(row["step"], row["reward"]) for row in rows] == [(1, 3.0)]


def test_a_resumed_writer_marks_redone_steps_for_tensorboard(tmp_path):
    from tensorboardX.proto import event_pb2

    with train.MetricsWriter(tmp_path) as writer:
        for step in (1, 2, 3):
            writer.write(step, {"reward": float(step)})
    time.sleep(1.1)  # event files are named by the second; a resume comes later than this
    with train.MetricsWriter(tmp_path, purge_step=3) as writer:
        writer.write(3, {"reward": 30.0})
    files = sorted(glob.glob(str(tmp_path / "tb" / "events.out.tfevents.*")))
    assert len(files) == 2
    starts = []
    with open(files[-1], "rb") as file:  # the resumed writer's file (names sort by time)
        while header := file.read(12):
            (length,) = struct.unpack("<Q", header[:8])
            event = event_pb2.Event.FromString(file.read(length))
            file.read(4)
            if event.HasField("session_log"):
                starts.append((event.step, event.session_log.status))
    # TensorBoard drops earlier events from this step on when it meets a START at that step.
    assert starts == [(3, event_pb2.SessionLog.START)]
