"""Detection: the rule schema and loader, the matching engine, and the correlator.

Error tree (STYLE.md: drawn in one place):

    TrainmedicError (trainmedic.errors)
     +-- RuleLoadError       every problem of every rule file, each with file and line
     +-- InputError          `diagnose` input that cannot be used (exit code 2)
"""
