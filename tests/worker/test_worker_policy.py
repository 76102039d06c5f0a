"""The worker's copy of the learner's policy: the learner's weights, and no optimizer to build."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import cloudpickle
import numpy as np
import pytest
import torch as th

#: What a fresh worker process does with a rollout request: builds its copy of the policy.
_WORKER = textwrap.dedent(
    """
    import sys
    import cloudpickle
    import numpy as np
    import torch as th
    from daskvec.worker.on_policy import _policy

    request, obs = cloudpickle.loads(open(sys.argv[1], "rb").read())

    class Group:  # what _policy keys its cache on and names in its log line
        env_indices = [0]

    policy = _policy(Group(), request)
    with th.no_grad():
        logits = policy.get_distribution(th.as_tensor(obs)).distribution.logits.numpy()
    np.save(sys.argv[2], logits)
    print(isinstance(policy.optimizer, th.optim.Optimizer), "sympy" in sys.modules)
    """
)


@pytest.mark.processes
@pytest.mark.timeout(180)
def test_the_workers_copy_of_the_policy_has_the_weights_and_builds_no_optimizer(tmp_path: Path) -> None:
    """A worker never trains: building a torch optimizer there cost seconds per worker process
    (it imports torch._dynamo and sympy) on the first rollout, a replacement worker's too."""
    from stable_baselines3 import PPO

    from daskvec._core.rollouts import PolicyShipment

    model = PPO("MlpPolicy", "CartPole-v1", device="cpu", seed=0)
    obs = np.array([[0.01, -0.02, 0.03, 0.04], [0.2, 0.1, -0.1, 0.0]], dtype=np.float32)
    request = PolicyShipment().update(model.policy, seed=1).request(4)
    (tmp_path / "request.pkl").write_bytes(cloudpickle.dumps((request, obs)))
    out = subprocess.run(
        [sys.executable, "-c", _WORKER, str(tmp_path / "request.pkl"), str(tmp_path / "logits.npy")],
        capture_output=True,
        text=True,
        timeout=170,
        check=False,
    )
    assert out.returncode == 0, out.stderr[-2000:]
    built_optimizer, imported_sympy = out.stdout.split()[-2:]
    with th.no_grad():
        expected = model.policy.get_distribution(th.as_tensor(obs)).distribution.logits.numpy()
    np.testing.assert_array_equal(np.load(tmp_path / "logits.npy"), expected)
    assert built_optimizer == "False", "the worker's copy of the policy built a torch optimizer"
    assert imported_sympy == "False", "building the worker's copy of the policy imported sympy"
