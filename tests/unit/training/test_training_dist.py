"""The distributed environment comes from torchrun's variables and is checked."""

from __future__ import annotations

import pytest

from trainyard.training.dist import DistEnv
from trainyard.training.errors import DistributedSetupError


def test_no_launcher_means_a_world_of_one() -> None:
    env = DistEnv.from_environ({})
    assert (env.rank, env.world_size, env.local_rank, env.launched) == (0, 1, 0, False)
    assert env.is_main and env.is_node_leader


def test_torchrun_variables() -> None:
    env = DistEnv.from_environ(
        {
            "RANK": "3",
            "LOCAL_RANK": "1",
            "WORLD_SIZE": "4",
            "LOCAL_WORLD_SIZE": "2",
            "GROUP_RANK": "1",
        }
    )
    assert (env.rank, env.local_rank, env.world_size, env.local_world_size) == (3, 1, 4, 2)
    assert env.node_key == "group-1" and not env.is_main and not env.is_node_leader


@pytest.mark.parametrize(
    "environ, message",
    [
        ({"RANK": "4", "WORLD_SIZE": "4"}, "RANK=4 must lie in"),
        ({"RANK": "0"}, "RANK and WORLD_SIZE must be set together"),
        ({"RANK": "x", "WORLD_SIZE": "2"}, "RANK='x' is not an integer"),
        (
            {"RANK": "1", "WORLD_SIZE": "2", "LOCAL_RANK": "2", "LOCAL_WORLD_SIZE": "2"},
            "LOCAL_RANK=2",
        ),
    ],
)
def test_inconsistent_variables_are_refused(environ, message) -> None:
    with pytest.raises(DistributedSetupError, match=message):
        DistEnv.from_environ(environ)
