"""What a run is shown as: text summaries, memory tables, plots and the HTML timeline."""
