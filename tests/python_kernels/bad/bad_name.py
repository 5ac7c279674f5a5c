import lattn
plugin = lattn.Plugin("Bad-Name")


@plugin.impl("scan")
def scan(case, t):
    pass
