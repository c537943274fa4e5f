"""forge mode's sglang engines: processes (:mod:`.process`), their Ray actors (:mod:`.actor`), the HTTP client
(:mod:`.http`), the fleet that owns them (:mod:`.fleet`), the router, health monitors, fault injection and the
eval fleet."""
