"""A deterministic synthetic multi-hop world: the main job's corpus, generated, not downloaded.

Fictional countries, cities, people and companies; one passage per entity, several sentences
(facts in varied wording plus filler), and questions with gold answers, supporting passages and
supporting sentences (HotpotQA-style):
  single      one passage   "In which year was Vornacle Systems founded?"
  bridge      two passages  "In which city was the founder of Vornacle Systems born?"
  comparison  two passages  "Which company was founded earlier, X or Y?" / "Were A and B born
                            in the same country?" (yes/no)
Same seed -> byte-identical corpus and questions.
"""

from __future__ import annotations

import random
from dataclasses import dataclass

from rag.corpus import Corpus
from rag.types import Example, Passage

_ONSETS = ["b", "d", "f", "g", "k", "l", "m", "n", "p", "r", "s", "t", "v", "z", "br", "dr",
           "gr", "kl", "st", "th", "tr", "vr", "zh", "qu"]
_VOWELS = ["a", "e", "i", "o", "u", "ae", "ai", "ou", "io"]
_CODAS = ["", "n", "r", "l", "s", "th", "nd", "rk", "m", "x"]
_INDUSTRIES = ["shipbuilding", "software", "textiles", "pharmaceuticals", "aviation", "mining",
               "publishing", "robotics", "agriculture", "glassmaking", "banking", "optics"]
_PROFESSIONS = ["engineer", "chemist", "architect", "economist", "novelist", "physician",
                "cartographer", "violinist", "astronomer", "lawyer"]
_SUFFIXES = ["Systems", "Works", "Holdings", "Industries", "Company", "Group"]
_FILLER = [
    "Its archives are kept in a stone building near the old harbour.",
    "Local newspapers have written about it many times.",
    "A small museum nearby tells part of the story.",
    "Historians still disagree about some of the details.",
    "The region is known for its long winters and mild summers.",
    "Several streets were renamed in its honour.",
    "Visitors often confuse it with places of a similar name.",
    "A documentary about it was broadcast on regional television.",
]


@dataclass(frozen=True)
class SyntheticWorld:
    """Mirrors rag.corpus.loaders.Dataset's fields (name, corpus, examples)."""

    name: str
    corpus: Corpus
    examples: tuple[Example, ...]
    seed: int


class _Names:
    def __init__(self, rng: random.Random):
        self.rng = rng
        self.used: set[str] = set()

    def word(self, syllables: int) -> str:
        while True:
            w = "".join(self.rng.choice(_ONSETS) + self.rng.choice(_VOWELS) +
                        (self.rng.choice(_CODAS) if i == syllables - 1 else "")
                        for i in range(syllables)).capitalize()
            if w not in self.used:
                self.used.add(w)
                return w


def _pid(kind: str, i: int) -> str:
    return f"syn-{kind}-{i:03d}"


def make_synthetic_world(seed: int = 0, n_countries: int = 12, n_cities: int = 48,
                         n_people: int = 150, n_companies: int = 90,
                         n_questions: int = 240) -> SyntheticWorld:
    rng = random.Random(seed)
    names = _Names(rng)
    countries = [names.word(3) + rng.choice(["ia", "land", "stan", "ria"]) for _ in
                 range(n_countries)]
    cities = [{"name": names.word(2) + rng.choice(["ville", "burg", "ford", "haven", "mouth",
                                                    ""]),
               "country": rng.randrange(n_countries),
               "founded": rng.randint(900, 1700), "population": rng.randint(20, 900) * 1000}
              for _ in range(n_cities)]
    people = [{"name": f"{names.word(2)} {names.word(3)}", "city": rng.randrange(n_cities),
               "born": rng.randint(1890, 1985), "job": rng.choice(_PROFESSIONS)}
              for _ in range(n_people)]
    companies = [{"name": f"{names.word(3)} {rng.choice(_SUFFIXES)}",
                  "founder": rng.randrange(n_people), "city": rng.randrange(n_cities),
                  "founded": rng.randint(1900, 2015), "industry": rng.choice(_INDUSTRIES)}
                 for _ in range(n_companies)]

    passages: list[Passage] = []
    sent_of: dict[tuple[str, str], tuple[str, int]] = {}  # (entity key, fact) -> (title, sid)

    def add(kind: str, i: int, title: str, facts: list[tuple[str, str]]) -> None:
        sents = [s for _, s in facts]
        for _ in range(rng.randint(1, 2)):
            sents.insert(rng.randint(1, len(sents)), rng.choice(_FILLER))
        for fact, s in facts:
            sent_of[(f"{kind}{i}", fact)] = (title, sents.index(s))
        passages.append(Passage(_pid(kind, i), " ".join(sents), title,
                                {"sentences": sents, "kind": kind}))

    for i, c in enumerate(countries):
        members = [ct["name"] for ct in cities if countries[ct["country"]] == c][:4]
        add("country", i, c, [("kind", f"{c} is a country in the fictional Northern Reach."),
                              ("cities", f"Its towns include {', '.join(members) or 'none'}.")])
    for i, c in enumerate(cities):
        country = countries[c["country"]]
        add("city", i, c["name"], [
            ("country", rng.choice([f"{c['name']} is a city in {country}.",
                                    f"{c['name']} lies in the north of {country}.",
                                    f"The town of {c['name']} is located in {country}."])),
            ("founded", f"It was first settled in {c['founded']}."),
            ("population", f"About {c['population']:,} people live there."),
        ])
    for i, p in enumerate(people):
        city = cities[p["city"]]["name"]
        add("person", i, p["name"], [
            ("job", f"{p['name']} was a {p['job']}."),
            ("city", rng.choice([f"{p['name'].split()[0]} was born in {city} in {p['born']}.",
                                 f"Born in {p['born']} in {city}, {p['name'].split()[1]} grew "
                                 "up by the river."])),
            ("born", f"The records of {p['born']} list the birth."),
        ])
    for i, c in enumerate(companies):
        founder = people[c["founder"]]["name"]
        city = cities[c["city"]]["name"]
        add("company", i, c["name"], [
            ("industry", f"{c['name']} is a {c['industry']} firm headquartered in {city}."),
            ("founder", rng.choice([f"It was founded by {founder} in {c['founded']}.",
                                    f"{founder} established the company in {c['founded']}."])),
        ])

    def ex(qid: int, q: str, a: str, cat: str, facts: list[tuple[str, str]]) -> Example:
        sf = tuple(sent_of[f] for f in facts)
        titles = tuple(dict.fromkeys(t for t, _ in sf))
        id_of = {p.title: p.id for p in passages}
        return Example(id=f"syn-q{qid:04d}", question=q, answers=(a,), category=cat,
                       supporting_facts=sf, gold_titles=titles,
                       gold_passage_ids=tuple(id_of[t] for t in titles))

    examples: list[Example] = []
    kinds = ["single", "bridge", "comparison"]
    while len(examples) < n_questions:
        cat = kinds[len(examples) % 3]
        j = len(examples)
        if cat == "single":
            if rng.random() < 0.5:
                i = rng.randrange(n_companies)
                c = companies[i]
                examples.append(ex(j, f"In which year was {c['name']} founded?",
                                   str(c["founded"]), cat, [(f"company{i}", "founder")]))
            else:
                i = rng.randrange(n_people)
                p = people[i]
                examples.append(ex(j, f"In which city was {p['name']} born?",
                                   cities[p["city"]]["name"], cat, [(f"person{i}", "city")]))
        elif cat == "bridge":
            i = rng.randrange(n_companies)
            c = companies[i]
            f = c["founder"]
            if rng.random() < 0.5:
                examples.append(ex(j, f"In which city was the founder of {c['name']} born?",
                                   cities[people[f]["city"]]["name"], cat,
                                   [(f"company{i}", "founder"), (f"person{f}", "city")]))
            else:
                examples.append(ex(j, f"What was the profession of the person who founded "
                                      f"{c['name']}?", people[f]["job"], cat,
                                   [(f"company{i}", "founder"), (f"person{f}", "job")]))
        else:
            if rng.random() < 0.5:
                a, b = rng.sample(range(n_companies), 2)
                if companies[a]["founded"] == companies[b]["founded"]:
                    continue
                win = a if companies[a]["founded"] < companies[b]["founded"] else b
                examples.append(ex(j, f"Which company was founded earlier, "
                                      f"{companies[a]['name']} or {companies[b]['name']}?",
                                   companies[win]["name"], cat,
                                   [(f"company{a}", "founder"), (f"company{b}", "founder")]))
            else:
                a, b = rng.sample(range(n_people), 2)
                same = people[a]["born"] == people[b]["born"]
                examples.append(ex(j, f"Were {people[a]['name']} and {people[b]['name']} born "
                                      "in the same year?", "yes" if same else "no", cat,
                                   [(f"person{a}", "city"), (f"person{b}", "city")]))
    return SyntheticWorld(f"synthetic-{seed}", Corpus(passages), tuple(examples), seed)
