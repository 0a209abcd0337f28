"""`coopflow.rollouts(...)`: a run's joint answers as one pandas DataFrame, read from the store alone.

The table `coopflow show` prints and `coopflow export` writes (`coopflow.stages.operations.rollouts` joins it).
"""

from collections.abc import Iterable

from coopflow.stages.operations import rollouts as R


def rollouts(run: str | None = None, data_dir: str | None = None, updates: int | str | Iterable | None = None,
             eval: bool = False):
    """A run's joint answers as a pandas DataFrame, one row per agent of each joint action.

    Args:
        run: the run key (or a unique prefix of it, as `coopflow show` prints it); None: the newest run.
        data_dir: the data dir the run used (default: $COOPFLOW_HOME, else ./.coopflow).
        updates: which updates (an index, 'first', 'last', or a list of them); None: every update.
        eval: the run's final evaluation instead (columns `coopflow.stages.operations.rollouts.EVAL_COLUMNS`).

    Columns (`coopflow.stages.operations.rollouts.COLUMNS`): run_key, update, env_step, item_id, turn, node_id,
    joint, agent, sample, prompt, completion, reward, agent_reward, advantage, length, finished. Reads the store
    only: no model, no config, no server.
    """
    import pandas as pd

    store, info = R.open_run(run, data_dir)
    if eval:
        return pd.DataFrame(R.eval_rows(store, info), columns=list(R.EVAL_COLUMNS))
    return pd.DataFrame(R.joint_rows(store, info, R.select_updates(store, info, updates)), columns=list(R.COLUMNS))
