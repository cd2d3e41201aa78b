"""The GPU contact kit: stage scripts run by contact.sh, their shared helpers, and the importer
of their outputs into bench/results/ (README.md in this folder says which command to run)."""
