from idmctl.cli import main

main()
