"""A generated world where configuration choices matter: query families for which different
RAG configs are right, with the right one known by construction (`FAMILY_BEST`).

    world = make_choice_world()          # seed 0, ~300 questions, ~260 passages, < 1 s
    world.examples[0].category           # the family: a gold label, never a policy feature

Families (the example's `category`; routing features never read it):
  lexical      a rare identifier titles the passage ("In which year was instrument QX-4471
               calibrated?"); sibling instruments share every other word and calibration logs
               are closer in meaning to the question than the passage, so exact term matching
               (BM25) finds it and a bi-encoder mostly does not
  paraphrase   the question shares no content word with its passage ("Which timid night-active
               avian eats grain in the woods?" for "The Zorvik is a shy nocturnal bird that feeds
               on seeds in the forest."): BM25 has nothing to match, a bi-encoder matches meaning
  bridge       the answer is one hop away from the passage the question names ("In which city
               was the founder of Vornacle Systems born?"): the entity graph (or enough
               context to hold both passages) is needed
  comparison   two named passages are needed ("Which company was founded earlier, A or B?"):
               one passage is not enough, two or more are
  unanswerable an identifier that no passage holds, worded like a lexical question; the gold is
               marked `metadata.answerability = UNANSWERABLE`, so abstaining is the right answer
  duplicate    a comparison where the first company has near-duplicate passages (press notes
               under its title, repeating its name) that crowd the second out of a short list:
               diversity (MMR) or a longer list brings it back

Same seed -> byte-identical corpus and questions. The passages' words are chosen so the
families' right configs differ (measured by `bench/learners.py`, which prints a family ×
config quality table).
"""

from __future__ import annotations

import random

from rag.corpus import Corpus
from rag.corpus.synthetic import SyntheticWorld, _Names
from rag.types import Example, Passage

NAME = "synthetic-choices"
"""The dataset name `rag.corpus.loaders.load_dataset` knows this world by."""
FAMILIES = ("lexical", "paraphrase", "bridge", "comparison", "unanswerable", "duplicate")
FAMILY_BEST: dict[str, str] = {
    "lexical": "exact term match (bm25), small k",
    "paraphrase": "dense retrieval, small k",
    "bridge": "graph retrieval (second hop)",
    "comparison": "two or more passages (k >= 2)",
    "unanswerable": "an abstaining prompt",
    "duplicate": "MMR or a longer list",
}
"""What wins each family by construction (the module docstring says why)."""

# paraphrase family: (passage word, question word) pairs per attribute, no shared token
_TEMPER = [("shy", "timid"), ("fierce", "aggressive"), ("calm", "placid"), ("noisy", "loud")]
_TIME = [("nocturnal", "night-active"), ("diurnal", "day-active")]
_KIND = [("bird", "avian"), ("lizard", "reptile"), ("frog", "amphibian"), ("fox", "canine"),
         ("beetle", "insect"), ("rodent", "mouse-like animal")]
_FOOD = [("seeds", "grain"), ("fish", "minnows"), ("berries", "fruit"), ("worms", "larvae"),
         ("leaves", "foliage")]
_HOME = [("forest", "woods"), ("river", "stream"), ("mountains", "peaks"), ("desert", "dunes"),
         ("marsh", "swamp"), ("meadow", "grassland")]
_PREFIXES = ["QX", "ZK", "TR", "VL"]
_INDUSTRIES = ["shipbuilding", "software", "textiles", "aviation", "mining", "publishing",
               "robotics", "glassmaking", "banking", "optics"]
_SUFFIXES = ["Systems", "Works", "Holdings", "Industries", "Group"]
UNANSWERABLE = "UNANSWERABLE"


def make_choice_world(seed: int = 0, per_family: int = 50) -> SyntheticWorld:
    """The world of `seed` with `per_family` questions of each family (`FAMILIES`, interleaved
    in that order). Raises ValueError for `per_family` < 1."""
    if per_family < 1:
        raise ValueError(f"per_family must be >= 1, got {per_family}")
    rng = random.Random(seed)
    names = _Names(rng)
    passages: list[Passage] = []
    examples: list[Example] = []

    def add(pid: str, title: str, sents: list[str], kind: str) -> Passage:
        p = Passage(pid, " ".join(sents), title, {"sentences": sents, "kind": kind})
        passages.append(p)
        return p

    def ex(family: str, q: str, a: str, gold: list[Passage], sf: list[tuple[str, int]],
           meta: dict | None = None) -> None:
        examples.append(Example(
            id=f"chq-{len(examples):04d}", question=q, answers=(a,), category=family,
            supporting_facts=tuple(sf), gold_titles=tuple(dict.fromkeys(p.title for p in gold)),
            gold_passage_ids=tuple(dict.fromkeys(p.id for p in gold)), metadata=meta or {}))

    # --- instruments (lexical, unanswerable): one template; codes come in groups that are
    # permutations of the same four digits, so only the exact token tells siblings apart
    n_inst = 2 * per_family
    codes: list[str] = []
    used: set[str] = set()
    while len(codes) < n_inst + per_family:  # the last per_family codes name no passage
        digits = rng.sample("0123456789", 4)
        prefix = rng.choice(_PREFIXES)
        for _ in range(4):
            rng.shuffle(digits)
            c = f"{prefix}-{''.join(digits)}"
            if c not in used:
                used.add(c)
                codes.append(c)
    rng.shuffle(codes)
    codes = codes[:n_inst + per_family]
    instruments = []
    for i in range(n_inst):
        year = rng.randint(1900, 2020)
        p = add(f"chw-inst-{i:03d}", codes[i],
                [f"Instrument {codes[i]} is a pressure gauge kept in the municipal vault.",
                 f"It was calibrated in {year}."], "instrument")
        instruments.append((p, year))
    for i, year in enumerate(rng.sample(range(1900, 2021), per_family // 2 + 1)):
        # close in meaning to every instrument question, without any code: a bi-encoder ranks
        # these first, exact term matching ranks the code's passage first
        add(f"chw-log-{i:03d}", f"Calibration log {year}",
            [f"The {year} calibration log of the municipal vault lists every pressure gauge "
             "that was calibrated that season."], "log")

    # --- creatures (paraphrase): unique attribute combinations, questions in synonyms
    combos = [(t, tm, k, f, h) for t in range(len(_TEMPER)) for tm in range(len(_TIME))
              for k in range(len(_KIND)) for f in range(len(_FOOD)) for h in range(len(_HOME))]
    rng.shuffle(combos)
    creatures = []
    for i, (t, tm, k, f, h) in enumerate(combos[:per_family]):
        name = names.word(2)
        p = add(f"chw-crea-{i:03d}", name,
                [f"The {name} is a {_TEMPER[t][0]} {_TIME[tm][0]} {_KIND[k][0]} that feeds on "
                 f"{_FOOD[f][0]} in the {_HOME[h][0]}."], "creature")
        q = (f"Which {_TEMPER[t][1]} {_TIME[tm][1]} {_KIND[k][1]} eats {_FOOD[f][1]} among "
             f"the {_HOME[h][1]}?")
        creatures.append((p, name, q))

    # --- cities, people, companies (bridge, comparison, duplicate)
    cities = [names.word(2) + rng.choice(["ville", "burg", "ford", "haven"])
              for _ in range(max(8, per_family // 3))]
    people = []
    for i in range(per_family):
        person = f"{names.word(2)} {names.word(3)}"
        city = rng.choice(cities)
        p = add(f"chw-pers-{i:03d}", person,
                [f"{person} was a {rng.choice(['chemist', 'engineer', 'lawyer', 'novelist'])}.",
                 f"{person} was born in the city of {city}."], "person")
        people.append((p, person, city))
    n_comp = 3 * per_family
    companies = []
    years = rng.sample(range(1850, 2020), n_comp)
    for i in range(n_comp):
        comp = f"{names.word(3)} {rng.choice(_SUFFIXES)}"
        founder = i % per_family
        p = add(f"chw-comp-{i:03d}", comp,
                [f"{comp} is a {rng.choice(_INDUSTRIES)} firm.",
                 f"It was founded by {people[founder][1]} in {years[i]}."], "company")
        companies.append((p, comp, founder, years[i]))
    dup_firms = companies[2 * per_family:]
    for i, (_, comp, _, _) in enumerate(dup_firms):  # same title, no year: near-duplicates
        for j, note in enumerate(("record orders", "a new office", "a new chief executive",
                                  "a charity drive")):
            add(f"chw-note-{i:03d}-{j}", comp,
                [f"{comp} announced {note}.", f"A spokesperson for {comp} recalled that "
                 f"{comp} was founded by people who loved their trade."], "note")

    rng.shuffle(instruments)
    for n in range(per_family):
        # lexical
        p, year = instruments[n]
        code = p.title.split()[-1]
        ex("lexical", f"In which year was instrument {code} calibrated?", str(year), [p],
           [(p.title, 1)])
        # paraphrase
        p, name, q = creatures[n]
        ex("paraphrase", q, name, [p], [(p.title, 0)])
        # bridge
        p, comp, founder, _ = companies[n]
        fp, _, city = people[founder]
        ex("bridge", f"In which city was the founder of {comp} born?", city, [p, fp],
           [(p.title, 1), (fp.title, 1)])
        # comparison: two companies of the first 2 * per_family
        (pa, a, _, ya), (pb, b, _, yb) = companies[per_family + n], companies[n]
        win = a if ya < yb else b
        ex("comparison", f"Which company was founded earlier, {a} or {b}?", win, [pa, pb],
           [(pa.title, 1), (pb.title, 1)])
        # unanswerable: a code no passage holds
        ex("unanswerable", f"In which year was instrument {codes[n_inst + n]} calibrated?",
           UNANSWERABLE, [], [], {"answerability": UNANSWERABLE})
        # duplicate: the first company has three press notes repeating its name
        (pa, a, _, ya), (pb, b, _, yb) = dup_firms[n], companies[(n + 7) % (2 * per_family)]
        win = a if ya < yb else b
        ex("duplicate", f"Which company was founded earlier, {a} or {b}?", win, [pa, pb],
           [(pa.title, 1), (pb.title, 1)])
    return SyntheticWorld(f"{NAME}-{seed}", Corpus(passages), tuple(examples), seed)
