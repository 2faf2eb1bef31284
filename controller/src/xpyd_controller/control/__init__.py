"""The controller's pure core: pool counts, policy setup from a PDDeployment, status rendering, lease
arithmetic, PromQL per engine family, the Observation built from its answers, URL checks, and the
decision loop over Protocol-typed ports (the adapters in `adapters` do the I/O)."""
