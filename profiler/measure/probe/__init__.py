"""The in-process memory probe: an SGLang general plugin memfrac activates for the workers it starts."""
