"""`env:` — a task family as one name: what it expands to, what a config may override, and that keys see only the
resulting parts (never the name)."""

import sys
import textwrap

import pytest

from coopflow.artifacts import ArtifactStore
from coopflow.schemas.config import ConfigError, validate_config
from tests.conftest import small_config
from tests.test_key_inputs import run_keys

HUMANEVAL_PARTS = {
    "taskset": {"name": "humaneval"},
    "reward": {"name": "coopflow.envs.coding:humaneval_reward"},
    "formatters": [{"function": "coopflow.envs.coding:helper_prompt", "chat_template": True},
                   {"function": "coopflow.envs.coding:main_prompt", "chat_template": True}],
    "eval_logger": "coopflow.envs.coding:eval_logger",
    "eval_aggregator": "coopflow.envs.coding:eval_aggregator",
}


def _cfg(tmp_path, **sections) -> dict:
    data = small_config(tmp_path)
    data.pop("taskset")
    data.update(sections)
    return data


def test_every_shipped_environment_resolves_by_name_and_by_path():
    from coopflow.envs import ENVIRONMENTS, Environment
    from coopflow.schemas.config.environment import resolve_environment

    assert set(ENVIRONMENTS) >= {"story", "tldr", "arxiv", "humaneval", "completion", "gsm8k", "bfcl", "travel"}
    for name, path in ENVIRONMENTS.items():
        env = resolve_environment(name)
        assert isinstance(env, Environment) and env.name == name and env.description
        assert resolve_environment(path) is env
        frag = env.config()
        assert frag["taskset"]["name"] and frag["reward"]["name"]
        cfg = validate_config({"env": name, "agents": {"agent_model": "tiny", "num_agents": 2},
                               "trainer": {"num_turns": 1}})
        assert cfg.env == name and cfg.taskset.name == frag["taskset"]["name"]


def test_env_fills_the_parts_and_the_config_overrides_any_single_one():
    cfg = validate_config({"env": "humaneval", "agents": {"agent_model": "tiny", "num_agents": 2},
                           "taskset": {"num_items": 8}, "trainer": {"num_turns": 1}})
    assert (cfg.taskset.name, cfg.taskset.num_items) == ("humaneval", 8)  # merged key by key
    assert cfg.reward.name == "coopflow.envs.coding:humaneval_reward"
    assert [f.function for f in cfg.formatters] == ["coopflow.envs.coding:helper_prompt",
                                                    "coopflow.envs.coding:main_prompt"]
    assert cfg.eval_aggregator == "coopflow.envs.coding:eval_aggregator"
    own = validate_config({"env": "humaneval", "agents": {"agent_model": "tiny", "num_agents": 2},
                           "trainer": {"num_turns": 1}, "reward": {"name": "length_ratio"},
                           "formatters": [{"template": "A: {prompt}"}, {"template": "B: {prompt}"}]})
    assert own.reward.name == "length_ratio"  # the config's own reward
    assert [f.template for f in own.formatters] == ["A: {prompt}", "B: {prompt}"]  # a list is replaced whole
    assert own.taskset.name == "humaneval" and own.eval_logger == "coopflow.envs.coding:eval_logger"
    none = validate_config({"env": "humaneval", "agents": {"agent_model": "tiny", "num_agents": 2},
                            "trainer": {"num_turns": 1}, "eval_logger": None, "eval_aggregator": None})
    assert none.eval_logger is None  # an explicit null removes a part


def test_keys_follow_the_parts_never_the_name(tmp_path):
    """`env: story` and the same parts written out: the same keys; another part: other keys."""
    store = ArtifactStore(tmp_path / "artifacts")
    by_name = run_keys(validate_config(_cfg(tmp_path, env="story", taskset={"name": "story-length-ratio",
                                                                           "num_items": 4, "num_eval_items": 2})),
                       store)
    written = run_keys(validate_config(_cfg(tmp_path, taskset={"name": "story-length-ratio", "num_items": 4,
                                                              "num_eval_items": 2},
                                            reward={"name": "length_ratio"})), store)
    assert by_name == written
    other = run_keys(validate_config(_cfg(tmp_path, env="story", taskset={"num_items": 4, "num_eval_items": 2},
                                          reward={"name": "coopflow.envs.writing:dual_length_reward"})), store)
    assert other["taskset"] == by_name["taskset"] and other["scores"] != by_name["scores"]


@pytest.fixture
def user_package(tmp_path, monkeypatch):
    """A user's package `mytasks` on sys.path: an environment as a small class and one as a module."""
    pkg = tmp_path / "pkg" / "mytasks"
    pkg.mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "shout.py").write_text(textwrap.dedent('''
        """A user's own environment: two agents shout the story prompt."""
        from coopflow.envs import Environment


        def loud(item):
            return item["prompt"].upper()


        class Shout(Environment):
            name = "shout"
            description = "Both agents answer the prompt in capitals."
            taskset = "story-length-ratio"
            reward = "length_ratio"
            formatters = {"function": "mytasks.shout:loud"}
    '''))
    (pkg / "quiet.py").write_text(textwrap.dedent('''
        from coopflow.envs import Environment

        ENVIRONMENT = Environment(name="quiet", taskset="story-length-ratio", reward="length_ratio",
                                  formatters={"template": "quietly: {prompt}"})
    '''))
    monkeypatch.syspath_prepend(str(tmp_path / "pkg"))
    yield
    for m in [m for m in sys.modules if m.startswith("mytasks")]:
        del sys.modules[m]


def test_a_users_environment_is_one_class_or_one_module(tmp_path, user_package):
    cfg = validate_config(_cfg(tmp_path, env="mytasks.shout:Shout", taskset={"num_items": 4, "num_eval_items": 2}))
    assert cfg.formatters.function == "mytasks.shout:loud" and cfg.taskset.name == "story-length-ratio"
    quiet = validate_config(_cfg(tmp_path, env="mytasks.quiet", taskset={"num_items": 4, "num_eval_items": 2}))
    assert quiet.formatters.template == "quietly: {prompt}"
    store = ArtifactStore(tmp_path / "artifacts")
    assert run_keys(cfg, store)["rollouts"] != run_keys(quiet, store)["rollouts"]  # other prompts, other rollouts


@pytest.mark.parametrize("ref, says", [
    ("nope", "no environment named 'nope'; shipped: story"),
    ("no_such_pkg.mod:Env", "cannot import 'no_such_pkg.mod'"),
    ("coopflow.envs.coding:Nope", "coopflow.envs.coding has no Nope"),
    ("coopflow.envs.coding:humaneval_reward", "is a function, not a coopflow.envs.Environment"),
])
def test_a_bad_env_is_one_line_naming_it(ref, says):
    with pytest.raises(ConfigError) as err:
        validate_config({"env": ref})
    assert says in str(err.value) and "\n" not in str(err.value) and str(err.value).startswith("env: ")


def test_an_environment_refuses_an_unknown_part():
    from coopflow.envs import Environment

    with pytest.raises(TypeError, match="unknown part"):
        Environment(name="x", rewards="length_ratio")
