"""`tilesmith report`: what one run found, read back from its files. Nothing is measured here.

    build.py     build_report(run_id): the Report, from run.json, each track's profiles/ and best.json, the workspace
    rows.py      its rows: per kernel, per candidate, per graph, the program's estimate, the settings that win
    setting.py   which CUDA-graph setting wins, per graph and for the program
    html.py      render_html(report): one self-contained page
"""

from tilesmith.report.build import TOP_KERNELS, agent_budgets, build_report
from tilesmith.report.rows import CandidateRow, GraphReport, KernelRow, ProgramEstimate, Report

__all__ = ["build_report", "agent_budgets", "TOP_KERNELS", "Report", "GraphReport", "CandidateRow", "KernelRow",
           "ProgramEstimate"]
