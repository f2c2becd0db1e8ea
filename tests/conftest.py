"""Shared fixtures (for tests/ and tests/unit/). The synthetic world's indexes (real MiniLM,
tantivy, FAISS, graph) are built once per test session. Tests that read the evaluation data call
`require_dataset`, which skips them, naming the missing path, when the data is absent."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest
from tests.support.shared_serve import SharedServe

from rag.env import configure_runtime_env

configure_runtime_env()

REPO = Path(__file__).resolve().parents[1]

# Test tiers by the resource a module needs (one marker each; `pytest -m TIER` runs a tier):
#   unit       tests/unit: no Ray, no model weights, no index builds (seconds)
#   component  real weights, indexes, the CLI, in-process Ray Tune or Ray tasks
#   training   trains a model or policy (RLlib PPO, TRL, torch)
#   serve      starts Ray Serve in this process
#   system     several processes or an external server: Ray clusters and jobs, PostgreSQL,
#              Prometheus, HAProxy, OpenSearch, kill/restart and signals, whole user paths
# Modules not named below are `component` (tests/unit/test_tiers.py checks the names).
TIERS = {
    "training": {"test_ppo", "test_ppo_full_space", "test_ppo_policy", "test_ppo_readout",
                 "test_generator_sft", "test_grpo_smoke", "test_reranker_train",
                 "test_learners", "test_selection_ray", "test_selection_integration",
                 "test_gpu_models"},
    "serve": {"test_serving_app", "test_serve_policy", "test_policy_train",
              "test_policy_train_ppo"},
    "system": {"test_multinode", "test_store_postgres", "test_serving_prometheus",
               "test_serving_scaleout", "test_serving_crash", "test_serving_lifecycle",
               "test_train_submit", "test_opensearch_contract", "test_demo",
               "test_readme_own_data", "test_runbook_canary"},
}
TIER_NAMES = ("unit", "component", "training", "serve", "system")


def tier_of(path: Path) -> str:
    """The tier of the test module at `path` (module doc of `TIERS`)."""
    if path.parent.name == "unit":
        return "unit"
    return next((t for t, mods in TIERS.items() if path.stem in mods), "component")


def pytest_configure(config):
    for name in TIER_NAMES:
        config.addinivalue_line("markers", f"{name}: test tier (tests/conftest.py TIERS)")


def pytest_collection_modifyitems(config, items):
    for item in items:
        item.add_marker(getattr(pytest.mark, tier_of(Path(str(item.fspath)))))
    _group_serve_app_modules(items)


def _group_serve_app_modules(items) -> None:
    """Run the modules that use `serve_app` one after another (whole modules, in their order,
    at the place of the first), so the shared Serve runtime starts once for them."""
    mods: dict[Path, list] = {}
    for item in items:
        mods.setdefault(Path(str(item.fspath)), []).append(item)
    users = [m for m, its in mods.items() if any("serve_app" in i.fixturenames for i in its)]
    if len(users) < 2:
        return
    out = []
    for m, its in mods.items():
        if m == users[0]:
            out.extend(i for u in users for i in mods[u])
        elif m not in users:
            out.extend(its)
    items[:] = out


_SERVE = SharedServe()


@pytest.fixture(scope="session")
def serve_app() -> SharedServe:
    """The session's shared in-process Ray + Serve runtime (tests/support/shared_serve.py): a
    module deploys its app with `serve_app.deploy(args)` and gets the URL. The runtime is shut
    down after the last test that uses it (`pytest_runtest_teardown`), not between modules."""
    return _SERVE


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_teardown(item, nextitem):
    """After the module fixtures of `item` are torn down: stop the shared Serve runtime after
    the last test of the session that uses it."""
    yield
    if "serve_app" in item.fixturenames and not _serve_app_used_after(item):
        _SERVE.stop()


def _serve_app_used_after(item) -> bool:
    """Whether a test the session runs after `item` uses `serve_app`."""
    items = item.session.items
    later = items[items.index(item) + 1:] if item in items else []
    return any("serve_app" in i.fixturenames for i in later)


# The session's exit status, kept by `pytest_sessionfinish` for `pytest_unconfigure`.
_EXIT: dict[str, int] = {}


def pytest_sessionfinish(session, exitstatus):
    """Shut Ray down while the interpreter is whole: tests that run the tuner, RLlib or Serve
    in-process may leave a Ray driver up, whose native threads otherwise meet Python's
    finalization in an `atexit` handler."""
    _EXIT["status"] = int(exitstatus)
    ray = sys.modules.get("ray")
    if ray is not None and ray.is_initialized():
        ray.shutdown()


@pytest.hookimpl(trylast=True)
def pytest_unconfigure(config):
    """Leave with pytest's own exit status once every report is written, skipping
    interpreter finalization. CI once had all tests pass (1108 passed, 12 skipped) and then
    the process segfaulted during finalization, so `make test` failed on a green run: native
    libraries loaded by the suite (Ray, torch, FAISS, tantivy) tear down their threads in an
    order Python does not control. Set RAGPILOT_TEST_FINALIZE=1 to finalize normally (e.g. to
    look for that crash with `python -X faulthandler -m pytest`)."""
    if "status" not in _EXIT or os.environ.get("RAGPILOT_TEST_FINALIZE") == "1":
        return
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(_EXIT["status"])


@pytest.fixture(scope="session", autouse=True)
def shared_retrieval_memo(tmp_path_factory):
    """One retrieval memo for the whole session (`rl.kernel.evaluator.MEMO_DIR_ENV`): tests
    keep their own fresh row caches, but a question retrieved by one test is not retrieved (and
    timed three times) again by the next; subprocesses (the CLI, Ray workers) inherit it. The
    memo holds candidate lists only, the same for every test on the same corpus. Tests of the
    memo's cold path pass their own `memo_root` (tests/test_tuner_latency.py)."""
    import os

    from rl.kernel.evaluator import MEMO_DIR_ENV

    before = os.environ.get(MEMO_DIR_ENV)
    os.environ[MEMO_DIR_ENV] = str(tmp_path_factory.mktemp("retrieval-memo"))
    yield Path(os.environ[MEMO_DIR_ENV])
    if before is None:
        os.environ.pop(MEMO_DIR_ENV, None)
    else:
        os.environ[MEMO_DIR_ENV] = before


@pytest.fixture(scope="session")
def world():
    from rag.corpus.synthetic import make_synthetic_world

    return make_synthetic_world(seed=0)


@pytest.fixture(scope="session")
def world_indexes(world, tmp_path_factory):
    from rag.indexset import IndexSet

    idx = IndexSet.create(world.corpus, tmp_path_factory.mktemp("world-index"))
    idx.build_all(bm25=("tantivy", "bm25s"), dense=("flat",), graph=True)
    return idx


@pytest.fixture
def tiny_corpus():
    from rag.corpus import Corpus
    from rag.types import Passage

    return Corpus([
        Passage("cat", "The cat sat on the warm mat all afternoon.", "Cats"),
        Passage("dog", "Dogs were running through the city parks at dawn.", "Dogs"),
        Passage("statin", "Statins lower LDL cholesterol in adults with heart disease.",
                "Statins"),
        Passage("paris", "Paris is the capital and largest city of France.", "Paris"),
        Passage("rome", "Rome is the capital city of Italy, founded on seven hills.", "Rome"),
    ])


def require_dataset(relpath: str = "") -> Path:
    """The evaluation data root, resolved as the loaders do (`rag.corpus.loaders.data_root`:
    $RAGPILOT_DATA, else the nearest `shared/datasets` beside a parent folder), joined with
    `relpath` (e.g. "hotpotqa/hotpot_dev_distractor_1100.jsonl"). Skips the calling test with
    a reason naming the missing path when the root or that path does not exist: a clean clone
    without the data passes with these tests skipped."""
    from rag.corpus.loaders import data_root
    from rag.errors import DataError

    hint = "set RAGPILOT_DATA or check out ../shared/datasets beside the repository"
    try:
        root = data_root()
    except DataError:
        pytest.skip(f"evaluation data not found: no shared/datasets beside {REPO} and "
                    f"RAGPILOT_DATA unset ({hint})")
    path = root / relpath if relpath else root
    if not path.exists():
        pytest.skip(f"evaluation data not found at {path} ({hint})")
    return path


def tiny_smollm2_llama(dest: Path) -> Path:
    """A randomly initialised 1-layer Llama with SmolLM2's tokenizer and chat template, saved
    at `dest`: stands in for a generator in device-step tests. Skips the calling test when the
    SmolLM2 weights (whose converted folder holds the tokenizer) are not installed."""
    from rag.errors import ModelNotFoundError
    from rag.generation.local import ensure_converted

    try:
        smol = ensure_converted("smollm2-135m-instruct")  # its tokenizer; the set-up made it
    except ModelNotFoundError as exc:
        pytest.skip(f"SmolLM2 weights not installed: {exc}")
    import torch
    from transformers import AutoTokenizer, LlamaConfig, LlamaForCausalLM

    tok = AutoTokenizer.from_pretrained(str(smol))
    torch.manual_seed(0)
    tiny = LlamaForCausalLM(LlamaConfig(vocab_size=len(tok), hidden_size=16,
                                        intermediate_size=32, num_hidden_layers=1,
                                        num_attention_heads=2, num_key_value_heads=2,
                                        bos_token_id=tok.bos_token_id,
                                        eos_token_id=tok.eos_token_id))
    tiny.save_pretrained(str(dest))
    tok.save_pretrained(str(dest))
    return dest
