"""What we know of slime and miles, kept as data read from their sources at pinned commits: their flag tables
(``flags``: ``slime_flags.json``, ``miles_flags.json``, written by ``scripts/backend-flags``) and what their code
requires, refuses, skips or falls back on (``rules``: ``upstream_rules.json``, re-checked by
``scripts/backend-rules``), each row citing upstream file:line. The ground floor: json and the standard library
only, so the API, the dumps and the replay rollout function inside a team's image read it."""
