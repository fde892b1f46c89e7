from lra.benchmarks.yoso_cost.report import main

main()
