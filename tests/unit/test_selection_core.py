"""SelectionEnv, features, rewards, BC, RAFT, rewrite and config validation on hand-built pools
(real build_pool / observe / ExtractiveReader; embeddings are small seeded vectors)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from rag.corpus import Corpus
from rag.errors import ConfigError
from rag.types import Example, Hit, Passage
from rl.selection.bc import expert_selection, oracle_selection, train_bc
from rl.selection.config import SelectionConfig
from rl.selection.env import SelectionEnv
from rl.selection.features import CAND_DIM, build_pool, observe
from rl.selection.policy import rollout
from rl.selection.raft import train_raft
from rl.selection.rewards import SelectionReward, selection_metrics
from rl.selection.rewrite import QueryRewriter

K, B = 20, 4


def _world(n_queries: int = 24, seed: int = 0):
    """Each query: 2 gold passages (a bridge: the first names the second's title, the second
    holds the answer year), 2 near-duplicates of gold 1, and distractors."""
    rng = np.random.default_rng(seed)
    pools = []
    for q in range(n_queries):
        person, town, year = f"Zorvath{q}", f"Quillby{q}", 1900 + q
        ex_id = f"q{q}"
        passages = [
            Passage(f"{ex_id}-g1", f"{person} was a painter born in {town}.", person),
            Passage(f"{ex_id}-g2", f"{town} was founded in {year} by settlers.", town),
            Passage(f"{ex_id}-d1", f"{person} was a painter born in {town} long ago.", person),
            Passage(f"{ex_id}-d2", f"{person} was a painter, born in {town}.", person),
        ] + [Passage(f"{ex_id}-x{i}", f"Unrelated text number {i} about rivers and {1800 + i}.",
                     f"River {i}") for i in range(K)]
        corpus = Corpus(passages)
        ex = Example(ex_id, f"When was the birthplace of {person} founded?", (str(year),),
                     (f"{ex_id}-g1", f"{ex_id}-g2"))
        order = [f"{ex_id}-g1", f"{ex_id}-d1", f"{ex_id}-d2"] + \
            [f"{ex_id}-x{i}" for i in range(5)] + [f"{ex_id}-g2"] + \
            [f"{ex_id}-x{i}" for i in range(5, K - 4)]
        hits = [Hit(1.0 - i / K, pid) for i, pid in enumerate(order)]
        dim = 8
        base = rng.normal(size=dim)
        vec = {}
        for p in passages:
            v = rng.normal(size=dim)
            if p.id.endswith(("-g1", "-d1", "-d2")):
                v = base + 0.05 * rng.normal(size=dim)
            vec[p.id] = v / np.linalg.norm(v)
        qv = base + 0.5 * rng.normal(size=dim)
        lists = {"bm25": hits, "dense": hits, "graph": hits[::-1], "hybrid": hits}
        pools.append(build_pool(ex, ex.question, lists, corpus, qv / np.linalg.norm(qv),
                                lambda ids, vec=vec: np.stack([vec[i] for i in ids]), K,
                                "hybrid"))
    return pools


@pytest.fixture(scope="module")
def pools():
    return _world()


@pytest.fixture(scope="module")
def cfg():
    return SelectionConfig.load().replace(**{"bc.epochs": 40, "raft.rounds": 2,
                                             "raft.samples": 4})


def test_config_names_offending_key(tmp_path):
    p = tmp_path / "s.yaml"
    p.write_text("selection:\n  env:\n    k: 30\n")
    with pytest.raises(ConfigError) as e:
        SelectionConfig.load(p)
    assert e.value.field == "selection.env.k"
    p.write_text("selection:\n  reward:\n    bogus: 1\n")
    with pytest.raises(ConfigError) as e:
        SelectionConfig.load(p)
    assert e.value.field == "selection.reward.bogus" and "unknown key" in str(e.value)
    p.write_text("selection:\n  ppo:\n    minibatch_size: 512\n    train_batch_size: 64\n")
    with pytest.raises(ConfigError, match="minibatch_size"):
        SelectionConfig.load(p)
    with pytest.raises(ConfigError) as e:
        SelectionConfig.load().replace(**{"env.max_steps": 9})
    assert e.value.field == "selection.env.max_steps"
    assert SelectionConfig.load().env.max_steps in (3, 4, 5)


def test_observation_and_mask(pools):
    p = pools[0]
    o = observe(p, [], K, B)
    assert o["cand"].shape == (K, CAND_DIM) and o["action_mask"].shape == (K + 1,)
    assert o["action_mask"][K] == 0  # no stop before the first pick
    assert o["action_mask"][:p.n].sum() == p.n
    o2 = observe(p, [0], K, B)
    assert o2["action_mask"][0] == 0 and o2["action_mask"][K] == 1
    i_nov = CAND_DIM - 6  # novelty column
    # near-duplicate of the selected passage is much less novel than an unrelated one
    d1, x = p.ids.index("q0-d1"), p.ids.index("q0-x3")
    assert o2["cand"][d1, i_nov] < 0.2 < o2["cand"][x, i_nov]
    # the bridge feature: the selected passage mentions g2's title (the town)
    g2 = p.ids.index("q0-g2")
    assert o2["cand"][g2, i_nov + 2] == 1.0 and o2["cand"][x, i_nov + 2] == 0.0
    full = observe(p, [0, 1, 2, 3], K, B)
    assert full["action_mask"][:K].sum() == 0 and full["action_mask"][K] == 1


def test_env_episode_and_rewards(pools, cfg):
    rw = SelectionReward(cfg.reward)
    env = SelectionEnv(pools=pools, reward=rw, cfg=cfg.env)
    obs, _ = env.reset(options={"pool": 0})
    p = pools[0]
    g1, g2 = p.ids.index("q0-g1"), p.ids.index("q0-g2")
    _, r1, done, _, _ = env.step(g1)
    assert not done
    _, r2, done, _, info = env.step(g2)
    assert not done and info["selected"] == [g1, g2]
    _, r3, done, trunc, _ = env.step(K)  # stop
    assert done and not trunc
    final, parts = rw.final(p, [g1, g2])
    assert parts["answer_f1"] == 1.0 and parts["support_f1"] == 1.0
    assert r3 == pytest.approx(final)
    assert r1 == pytest.approx(rw.step(p, [], g1)) and r1 > 0
    # a near-duplicate pick is shaped below a novel one (MMR novelty)
    d1 = p.ids.index("q0-d1")
    assert rw.step(p, [g1], d1) < rw.step(p, [g1], g2)
    # the budget ends the episode; illegal (repeated) action stops without adding
    env.reset(options={"pool": 1})
    env.step(0)
    _, _, done, _, info = env.step(0)
    assert done and info["selected"] == [0]
    final_only = SelectionReward(cfg.reward.model_copy(update={"shaping": "final_only"}))
    assert final_only.step(p, [g1], d1) == 0.0


def test_metrics_and_oracle(pools, cfg):
    rw = SelectionReward(cfg.reward)
    p = pools[0]
    base = selection_metrics(rw, p, p.rerank_order[:B])
    orc = oracle_selection(p, B)
    good = selection_metrics(rw, p, orc)
    assert sorted(p.ids[i] for i in orc) == ["q0-g1", "q0-g2"]
    assert good["support_f1"] == 1.0 and good["answer_f1"] == 1.0
    assert base["redundancy"] > good["redundancy"] == 0.0
    sel, kind = expert_selection(p, rw, B)
    assert kind == "oracle" and sel == orc


def test_bc_then_raft_learn_the_oracle(pools, cfg):
    torch.manual_seed(0)
    rw = SelectionReward(cfg.reward)
    train, test = pools[:18], pools[18:]
    net, info = train_bc(train, rw, cfg.bc, K, B, seed=0)
    assert info["experts"]["oracle"] == len(train) and info["epochs_run"] >= 1
    f1 = [selection_metrics(rw, p, rollout(net, p, K, B).selected)["support_f1"] for p in test]
    base = [selection_metrics(rw, p, p.rerank_order[:B])["support_f1"] for p in test]
    assert np.mean(f1) > np.mean(base) + 0.2
    net2, rinfo = train_raft(net, train, rw, cfg.raft, K, B, seed=0)
    assert len(rinfo["rounds"]) == 2 and rinfo["best_round"] in (0, 1, 2)
    ret = [rw.episode_return(p, rollout(net2, p, K, B).selected) for p in test]
    base_ret = [rw.episode_return(p, p.rerank_order[:B]) for p in test]
    assert np.mean(ret) > np.mean(base_ret)


def test_query_rewrite_modes():
    ex = Example("m1", "what about its price?", history=(
        {"role": "user", "text": "tell me about the Acme phone"},
        {"role": "agent", "text": "It is a phone."},
        {"role": "user", "text": "does it have a camera"}))
    assert QueryRewriter("last_turn").rewrite(ex) == "what about its price?"
    assert QueryRewriter("concat", history_turns=1).rewrite(ex) == \
        "does it have a camera what about its price?"
    assert QueryRewriter("concat", history_turns=2).rewrite(ex).startswith("tell me about")
    calls = []
    rw = QueryRewriter("generator", generate=lambda m: calls.append(m) or
                       "What is the price of the Acme phone?\nextra")
    assert rw.rewrite(ex) == "What is the price of the Acme phone?"
    rw.rewrite(ex)
    assert len(calls) == 1 and "Acme phone" in calls[0][1]["content"]  # cached; history shown
    empty = QueryRewriter("generator", generate=lambda p: "  ")
    assert empty.rewrite(ex) == QueryRewriter("concat").rewrite(ex)  # falls back
    with pytest.raises(ConfigError, match="selection.mtrag.rewrite"):
        QueryRewriter("summarise")


CHAT_TEMPLATE = ("{% for m in messages %}<|{{ m['role'] }}|>{{ m['content'] }}<|end|>\n"
                 "{% endfor %}{% if add_generation_prompt %}<|assistant|>{% endif %}")


class _StubModel:
    """Records the prompt ids and 'generates' a fixed continuation."""

    device = "cpu"

    def __init__(self, reply_ids):
        self.reply_ids, self.inputs = reply_ids, []

    def generate(self, input_ids, attention_mask=None, **kw):
        self.inputs.append(input_ids[0].tolist())
        self.kwargs = kw
        return torch.cat([input_ids, torch.tensor([self.reply_ids])], dim=1)


def _stub_generator(chat_template: str | None):
    """A stand-in for rag.generation.local.TransformersGenerator: a real word-level tokenizer
    (with or without a chat template) and a stub model."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    from rag.generation.base import Generator

    words = ["<pad>", "<unk>", "What", "is", "the", "price", "of", "Acme", "phone", "?"]
    tk = Tokenizer(models.WordLevel(vocab={w: i for i, w in enumerate(words)},
                                    unk_token="<unk>"))
    tk.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tok = PreTrainedTokenizerFast(tokenizer_object=tk, pad_token="<pad>", unk_token="<unk>")
    if chat_template:
        tok.chat_template = chat_template

    class Stub(Generator):
        name = "stub-gen"
        fingerprint = "stub"
        cache = None

        def __init__(self):
            self.tokenizer = tok
            self.model = _StubModel(tok("What is the price of Acme phone ?")["input_ids"])

        def generate(self, question, contexts, prompt_id, max_new_tokens=48, temperature=0.0):
            raise AssertionError("a rewrite must not go through a QA prompt template")

    return Stub()


def test_generator_rewrite_prompt_is_rendered_through_the_chat_template():
    """The rewrite has its own prompt (no QA template around it, no empty passage list),
    rendered once through the generator's chat template."""
    from rl.selection.rewrite import render_rewrite_prompt, rewrite_messages

    ex = Example("m1", "what about its price?", history=(
        {"role": "user", "text": "tell me about the Acme phone"},
        {"role": "agent", "text": "It is a phone."}))
    gen = _stub_generator(CHAT_TEMPLATE)
    rw = QueryRewriter("generator", generator=gen)
    assert rw.rewrite(ex) == "What is the price of Acme phone ?"
    expected = (
        "<|system|>You rewrite the last user question of a conversation as a standalone "
        "question.<|end|>\n"
        "<|user|>Conversation:\nuser: tell me about the Acme phone\nagent: It is a phone.\n\n"
        "Last user question: what about its price?\n\n"
        "Rewrite the last user question so that it can be understood without the "
        "conversation. Answer with the rewritten question only.<|end|>\n<|assistant|>")
    assert render_rewrite_prompt(gen.tokenizer, rewrite_messages(ex, 2)) == expected
    assert gen.model.inputs == [gen.tokenizer(expected, add_special_tokens=False)["input_ids"]]
    assert gen.model.kwargs["do_sample"] is False and gen.model.kwargs["max_new_tokens"] == 48
    assert "Passages" not in expected and "Answer in a few words" not in expected
    # a model without a chat template gets the plain rendering
    plain = _stub_generator(None)
    assert render_rewrite_prompt(plain.tokenizer, rewrite_messages(ex, 2)) == (
        "You rewrite the last user question of a conversation as a standalone question.\n\n"
        "Conversation:\nuser: tell me about the Acme phone\nagent: It is a phone.\n\n"
        "Last user question: what about its price?\n\nRewrite the last user question so "
        "that it can be understood without the conversation. Answer with the rewritten "
        "question only.\nRewritten question:")


def test_bench_markdown_lists_ablation_arms_not_run():
    """bench/selection.py's table says which arm did not run and why (run info
    `ablation_notes`), next to the rows of the same ablation, instead of leaving it out."""
    from bench.selection import markdown

    why = "not run: no cross-encoder registered as 'reranker-minilm@best' (train one: ...)"
    rows = [{"dataset": "hotpotqa", "system": f"ablation:{s}", "metric": m, "value": 0.5,
             "ci_low": None, "ci_high": None, "n": 3}
            for s in ("reranker=none rerank", "reranker=cosine bc_raft", "k=20 rerank")
            for m in ("support_f1", "answer_f1")]
    md = markdown(rows, {"hotpotqa": {"ablation_notes": {"reranker=cross_encoder": why}}})
    lines = md.splitlines()
    at = lines.index("| reranker=cross_encoder | not run |  |")
    assert lines[at - 1].startswith("| reranker=cosine bc_raft |")
    assert lines[at + 1].startswith("| k=20 rerank |")
    assert f"- `reranker=cross_encoder`: {why}" in lines
