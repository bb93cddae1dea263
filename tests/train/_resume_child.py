"""`experiments/train.py` in a child process, with a reward a random policy earns and kill hooks.

    python -m tests.train._resume_child --config=tests/train/_resume_config.py --workdir=DIR

The run trains on the chain task's prompts with the parity reward (first completion token even:
a random policy earns it about half the time, so every step moves the parameters). Environment
variables make the process die at a chosen point, for `test_resume.py`:

    GDRO_TEST_KILL_AFTER_SAVE=K   SIGKILL right after the checkpoint of step K is saved
    GDRO_TEST_KILL_IN_SAVE=K      SIGKILL inside the save of step K, when every item is written
                                  but the step folder is not yet renamed into place
    GDRO_TEST_SIGTERM_IN_STEP=K   send itself SIGTERM while step K runs
    GDRO_TEST_HOST_REWARD=1       score on the host (numpy parity) instead of inside jit
"""

import os
import signal

from absl import app
from orbax.checkpoint._src.path import atomicity

from experiments import train as entry_point
from gdro_jax.train import _loop
from tests.train.configs import host_parity_reward, parity_reward


def _step_from_env(name: str) -> int | None:
    value = os.environ.get(name)
    return int(value) if value else None


def install_hooks() -> None:
    build_run = _loop.build_run
    if os.environ.get("GDRO_TEST_HOST_REWARD"):
        _loop.build_run = lambda config, **kwargs: build_run(
            config, host_reward_fn=host_parity_reward
        )
    else:
        _loop.build_run = lambda config, **kwargs: build_run(config, reward_fn=parity_reward)

    kill_after = _step_from_env("GDRO_TEST_KILL_AFTER_SAVE")
    if kill_after is not None:
        save = _loop._save

        def save_then_kill(manager, run, state, *args, **kwargs):
            path = save(manager, run, state, *args, **kwargs)
            if int(state.step) == kill_after:
                os.kill(os.getpid(), signal.SIGKILL)
            return path

        _loop._save = save_then_kill

    kill_in = _step_from_env("GDRO_TEST_KILL_IN_SAVE")
    if kill_in is not None:
        finalize = atomicity.AtomicRenameTemporaryPath.finalize

        async def finalize_or_kill(self):
            # The step folder itself (its items are finalized inside it first).
            if self.get_final().name == str(kill_in):
                os.kill(os.getpid(), signal.SIGKILL)
            return await finalize(self)

        atomicity.AtomicRenameTemporaryPath.finalize = finalize_or_kill

    term_in = _step_from_env("GDRO_TEST_SIGTERM_IN_STEP")
    if term_in is not None:
        run_step = _loop.run_step

        def run_step_with_sigterm(run, state, prompt_ids):
            if int(state.step) + 1 == term_in:
                os.kill(os.getpid(), signal.SIGTERM)
            return run_step(run, state, prompt_ids)

        _loop.run_step = run_step_with_sigterm


if __name__ == "__main__":
    install_hooks()
    app.run(entry_point.main)
