"""The agent-CLI integration: the brief in each CLI's prompt file (``inject``) and
the server and hook entries in each CLI's configuration (``install``)."""
