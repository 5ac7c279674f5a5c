import lattn
plugin = lattn.Plugin("bad_layout")


@plugin.impl("scan", layout="BHDT")
def scan(case, t):
    pass
