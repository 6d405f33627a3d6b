from fsdpctl.cli import main

main()
