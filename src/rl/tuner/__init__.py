"""The tuner: the one search protocol (`rl.tuner.ask_tell`, executed in this process or on
`tune.Tuner`), its searchers, the PPO tuner and its env, bandits over served variants, reports,
and the one tuning run (`rl.tuner.run`)."""
