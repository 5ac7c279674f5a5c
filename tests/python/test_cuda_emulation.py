"""A float64 numpy port of the CUDA kernels' index logic (kernels/cuda/chunked.cu and scan.cu).

No GPU is needed: each kernel's loops over column slices, chunks, staged row blocks and 16 x 16
tiles (with the causal skips, the zero padding, the gamma-power indices and the operand swaps of
the dq and dk passes) are transcribed loop for loop, and the results are held to a direct float64
implementation of SPEC section 1. Buffers start as NaN, so a read of anything the kernel did not
write shows. It checks the algebra and the indexing, not CUDA itself (WMMA layouts, barriers,
races): that is what lattn_cuda_tests and compute-sanitizer do on a GPU. Keep it in step with the
.cu files when their loops change.
"""

import unittest

import numpy as np

kSlice=64
def r16(x): return (x+15)//16*16

def stage(dst, src, D, col0, valid_rows, rows, width):
    dst[:rows,:width]=0
    vr=min(valid_rows,rows)
    w=max(0,min(width, D-col0))
    dst[:vr,:w]=src[:vr, col0:col0+w]

def setup(s0, trans, D, Dp, jw, col0, gamma, Cp):
    pw=np.array([gamma**k for k in range(Cp+1)])
    Sf=np.full((Dp,kSlice),np.nan)
    for r in range(Dp):
        for c in range(jw):
            col=col0+c
            v=0.0
            if r<D and col<D: v = s0[col,r] if trans else s0[r,col]
            Sf[r,c]=v
    return pw,Sf

def fwd_kernel(A,B,X,s0,trans,C,RB,gamma,scale,final):
    T,D=A.shape; Cp,Dp=r16(C),r16(D); out=np.full((T,D),np.nan); fin=np.full((D,D),np.nan)
    for js in range((Dp+kSlice-1)//kSlice):
        col0=js*kSlice; jw=min(kSlice,Dp-col0); ntj=jw//16; ntd=Dp//16
        pw,Sf=setup(s0,trans,D,Dp,jw,col0,gamma,Cp)
        Bf=np.full((Cp,Dp),np.nan); Ar=np.full((RB,Dp),np.nan); Xs=np.full((Cp,kSlice),np.nan); Ps=np.full((RB,Cp),np.nan)
        for c0 in range(0,T,C):
            n=min(C,T-c0); nt=(n+15)//16
            stage(Bf,B[c0:],D,0,n,nt*16,Dp); stage(Xs,X[c0:],D,col0,n,nt*16,jw)
            for r0 in range(0,nt*16,RB):
                rows=min(RB,nt*16-r0); nti=rows//16; g0=r0//16
                stage(Ar,A[c0+r0:],D,0,n-r0,rows,Dp)
                for t in range(nti*(g0+nti)):
                    ti=t//(g0+nti); tj=t-ti*(g0+nti)
                    if tj>g0+ti: continue
                    acc=np.zeros((16,16))
                    for k in range(ntd):
                        acc+=Ar[ti*16:ti*16+16,k*16:k*16+16]@Bf[tj*16:tj*16+16,k*16:k*16+16].T
                    for e in range(256):
                        r,c=e>>4,e&15; i=r0+ti*16+r; j=tj*16+c
                        v=acc[r,c]*pw[i-j]*scale if (j<=i and i<n) else 0.0
                        Ps[ti*16+r,j]=v
                for t in range(nti*ntj):
                    ti=t//ntj; tj=t-ti*ntj
                    acc=np.zeros((16,16))
                    for k in range(ntd):
                        acc+=Ar[ti*16:ti*16+16,k*16:k*16+16]@Sf[k*16:k*16+16,tj*16:tj*16+16]
                    for e in range(256):
                        r,c=e>>4,e&15; i=r0+ti*16+r
                        acc[r,c]*=scale*pw[i+1]
                    for k in range(g0+ti+1):
                        acc+=Ps[ti*16:ti*16+16,k*16:k*16+16]@Xs[k*16:k*16+16,tj*16:tj*16+16]
                    for e in range(256):
                        r,c=e>>4,e&15; i=r0+ti*16+r; col=col0+tj*16+c
                        if i<n and col<D: out[c0+i,col]=acc[r,c]
            for j in range(n): Bf[j,:]*=pw[n-1-j]
            Sf[:Dp,:jw]*=pw[n]
            for t in range(ntd*ntj):
                ti=t//ntj; tj=t-ti*ntj
                acc=Sf[ti*16:ti*16+16,tj*16:tj*16+16].copy()
                for k in range(nt):
                    acc+=Bf[k*16:k*16+16,ti*16:ti*16+16].T@Xs[k*16:k*16+16,tj*16:tj*16+16]
                Sf[ti*16:ti*16+16,tj*16:tj*16+16]=acc
        if final:
            for r in range(D):
                for c in range(jw):
                    if col0+c<D: fin[r,col0+c]=Sf[r,c]
    return out,fin

def bwd_kernel(A,B,X,s0,trans,C,RB,gamma,scale,final):
    T,D=A.shape; Cp,Dp=r16(C),r16(D); out=np.full((T,D),np.nan); fin=np.full((D,D),np.nan)
    for js in range((Dp+kSlice-1)//kSlice):
        col0=js*kSlice; jw=min(kSlice,Dp-col0); ntj=jw//16; ntd=Dp//16
        pw,Sf=setup(s0,trans,D,Dp,jw,col0,gamma,Cp)
        Af=np.full((Cp,Dp),np.nan); Br=np.full((RB,Dp),np.nan); Gs=np.full((Cp,kSlice),np.nan); Ps=np.full((RB,Cp),np.nan)
        chunks=(T+C-1)//C
        for ch in range(chunks-1,-1,-1):
            c0=ch*C; n=min(C,T-c0); nt=(n+15)//16
            stage(Af,A[c0:],D,0,n,nt*16,Dp); stage(Gs,X[c0:],D,col0,n,nt*16,jw)
            for r0 in range(0,nt*16,RB):
                rows=min(RB,nt*16-r0); nti=rows//16; g0=r0//16
                stage(Br,B[c0+r0:],D,0,n-r0,rows,Dp)
                for t in range(nti*nt):
                    tj=t//nt; ti=t-tj*nt
                    if ti<g0+tj: continue
                    acc=np.zeros((16,16))
                    for k in range(ntd):
                        acc+=Br[tj*16:tj*16+16,k*16:k*16+16]@Af[ti*16:ti*16+16,k*16:k*16+16].T
                    for e in range(256):
                        r,c=e>>4,e&15; j=r0+tj*16+r; i=ti*16+c
                        v=acc[r,c]*pw[i-j]*scale if (j<=i and i<n) else 0.0
                        Ps[tj*16+r,i]=v
                for t in range(nti*ntj):
                    tj=t//ntj; tv=t-tj*ntj
                    acc=np.zeros((16,16))
                    for k in range(ntd):
                        acc+=Br[tj*16:tj*16+16,k*16:k*16+16]@Sf[k*16:k*16+16,tv*16:tv*16+16]
                    for e in range(256):
                        r,c=e>>4,e&15; j=r0+tj*16+r
                        acc[r,c]*= pw[n-1-j] if j<n else 0.0
                    for k in range(g0+tj,nt):
                        acc+=Ps[tj*16:tj*16+16,k*16:k*16+16]@Gs[k*16:k*16+16,tv*16:tv*16+16]
                    for e in range(256):
                        r,c=e>>4,e&15; j=r0+tj*16+r; col=col0+tv*16+c
                        if j<n and col<D: out[c0+j,col]=acc[r,c]
            for i in range(n): Af[i,:]*=scale*pw[i+1]
            Sf[:Dp,:jw]*=pw[n]
            for t in range(ntd*ntj):
                ti=t//ntj; tv=t-ti*ntj
                acc=Sf[ti*16:ti*16+16,tv*16:tv*16+16].copy()
                for k in range(nt):
                    acc+=Af[k*16:k*16+16,ti*16:ti*16+16].T@Gs[k*16:k*16+16,tv*16:tv*16+16]
                Sf[ti*16:ti*16+16,tv*16:tv*16+16]=acc
        if final:
            for r in range(D):
                for c in range(jw):
                    if col0+c<D: fin[r,col0+c]=Sf[r,c]
    return out,fin

def scan_kernel(row,col,query,s0,trans,reverse,alpha,beta,gamma,final_gamma):
    T,D=row.shape; S=(s0.T if trans else s0).copy(); out=np.zeros((T,D))
    for u in range(T):
        t=T-1-u if reverse else u
        decay=1.0 if (reverse and u==0) else gamma
        S=decay*S+alpha*np.outer(row[t],col[t])
        out[t]=beta*(S.T@query[t])
    return out,(gamma if final_gamma else 1.0)*S

def reference(q,k,v,h0,dO,dhT,gamma):
    T,D=q.shape; s=D**-0.5; S=h0.copy(); Ss=[]; o=np.zeros((T,D))
    for t in range(T):
        S=gamma*S+np.outer(k[t],v[t]); Ss.append(S.copy()); o[t]=s*S.T@q[t]
    hT=S
    G=dhT.copy(); dq=np.zeros((T,D)); dk=np.zeros((T,D)); dv=np.zeros((T,D))
    for t in range(T-1,-1,-1):
        G=(G if t==T-1 else gamma*G)+s*np.outer(q[t],dO[t])
        dq[t]=s*Ss[t]@dO[t]; dk[t]=G@v[t]; dv[t]=G.T@k[t]
    dh0=gamma*G
    return o,hT,dq,dk,dv,dh0

def rel(x, r):
    return np.linalg.norm(x - r) / np.linalg.norm(r)


SHAPES = [(1, 1, 4, 1.0), (9, 1, 4, 0.97), (20, 8, 64, 0.97), (100, 16, 32, 0.97), (64, 5, 16, 1.0),
          (37, 12, 1, 0.97), (300, 128, 128, 0.97), (45, 100, 16, 0.97), (70, 65, 48, 0.9), (130, 20, 100, 0.95)]


class CudaEmulationTest(unittest.TestCase):
    def test_chunked_and_scan_passes_match_the_reference(self):
        rng = np.random.default_rng(0)
        for T, D, C, gamma in SHAPES:
            q, k, v, dO = [rng.standard_normal((T, D)) for _ in range(4)]
            h0, dhT = [rng.standard_normal((D, D)) for _ in range(2)]
            ref = reference(q, k, v, h0, dO, dhT, gamma)
            s = D ** -0.5
            Ce = min(C, T)
            for RB in sorted({min(64, r16(Ce)), 16}):
                with self.subTest(impl="chunked", T=T, D=D, C=C, gamma=gamma, RB=RB):
                    o, hT = fwd_kernel(q, k, v, h0, False, Ce, RB, gamma, s, True)
                    dq, _ = fwd_kernel(dO, v, k, h0, True, Ce, RB, gamma, s, False)
                    dv, dh0 = bwd_kernel(q, k, dO, dhT, False, Ce, RB, gamma, s, True)
                    dk, _ = bwd_kernel(dO, v, q, dhT, True, Ce, RB, gamma, s, False)
                    for name, x, r in zip(("o", "hT", "dq", "dk", "dv", "dh0"), (o, hT, dq, dk, dv, dh0), ref):
                        self.assertLess(rel(x, r), 1e-12, name)
            with self.subTest(impl="scan", T=T, D=D, gamma=gamma):
                so, shT = scan_kernel(k, v, q, h0, False, False, 1, s, gamma, False)
                sdq, _ = scan_kernel(v, k, dO, h0, True, False, 1, s, gamma, False)
                sdv, sdh0 = scan_kernel(q, dO, k, dhT, False, True, s, 1, gamma, True)
                sdk, _ = scan_kernel(dO, q, v, dhT, True, True, s, 1, gamma, False)
                for name, x, r in zip(("o", "hT", "dq", "dk", "dv", "dh0"), (so, shT, sdq, sdk, sdv, sdh0), ref):
                    self.assertLess(rel(x, r), 1e-12, name)


if __name__ == "__main__":
    unittest.main()
