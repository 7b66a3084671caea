"""The Optuna side of dwgen: samplers by name, the study and its storage, and the search loop."""
