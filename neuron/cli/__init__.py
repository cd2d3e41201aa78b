"""The command line (`neuron train|plan|profile|...`): the parser and commands (main.py), argument
types (args.py), planner and timing options (planning.py) and how errors are reported (errors.py)."""
