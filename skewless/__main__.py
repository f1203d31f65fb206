from skewless.cli import main

main()
