from fsdpctl.entry import main

main()
