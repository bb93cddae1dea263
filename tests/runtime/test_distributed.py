"""When `experiments/train.py` joins a multi-process run (`runtime.initialize`): the
decision table, with a recording stand-in for `jax.distributed.initialize`."""

import pytest

from gdro_jax.runtime import initialize as initialize_distributed


class Recorder:
    def __init__(self):
        self.calls = []

    def __call__(self, **kwargs):
        self.calls.append(kwargs)


@pytest.mark.parametrize(
    "environ",
    [
        {},
        {"SLURM_JOB_ID": "7", "SLURM_NTASKS": "1"},  # a one-task SLURM job
        {"TPU_WORKER_HOSTNAMES": "localhost"},  # a single-host TPU VM
    ],
)
def test_one_process_does_nothing(environ):
    connect = Recorder()
    assert not initialize_distributed(environ=environ, initialize_fn=connect)
    assert connect.calls == []


@pytest.mark.parametrize(
    "environ",
    [
        {"SLURM_JOB_ID": "7", "SLURM_NTASKS": "2"},
        {"TPU_WORKER_HOSTNAMES": "t1-w-0,t1-w-1"},
        {"MEGASCALE_COORDINATOR_ADDRESS": "10.0.0.2"},
    ],
)
def test_a_cluster_in_the_environment_is_left_to_jax(environ):
    connect = Recorder()
    assert initialize_distributed(environ=environ, initialize_fn=connect)
    assert connect.calls == [{}]


def test_distributed_flag_lets_jax_detect_the_cluster():
    connect = Recorder()
    assert initialize_distributed(auto=True, environ={}, initialize_fn=connect)
    assert connect.calls == [{}]


def test_explicit_flags_are_passed_through():
    connect = Recorder()
    assert initialize_distributed("node0:1234", 2, 1, environ={}, initialize_fn=connect)
    assert connect.calls == [
        {"coordinator_address": "node0:1234", "num_processes": 2, "process_id": 1}
    ]
    # One process named explicitly is not a distributed run.
    assert not initialize_distributed("node0:1234", 1, 0, environ={}, initialize_fn=connect)
    assert len(connect.calls) == 1


@pytest.mark.parametrize(
    ("args", "auto", "message"),
    [
        (("node0:1234", None, None), False, "missing --num_processes, --process_id"),
        ((None, 2, 0), False, "missing --coordinator_address"),
        (("node0:1234", 2, 2), False, r"--process_id must be in \[0, --num_processes=2\), got 2"),
        (("node0:1234", 2, 0), True, "--distributed lets JAX detect the cluster"),
    ],
)
def test_inconsistent_flags_are_refused_naming_them(args, auto, message):
    connect = Recorder()
    with pytest.raises(ValueError, match=message):
        initialize_distributed(*args, auto=auto, environ={}, initialize_fn=connect)
    assert connect.calls == []
