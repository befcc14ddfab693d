"An S3 API server on localhost for the store tests (moto's, as s3fs's own tests use), behind a proxy that can fail."
import os, socket, subprocess, sys, threading, time
from fastxtend_accel.launching import free_port

class FaultyLink:
    """A TCP proxy between the clients and the server: `cut()` drops every connection and refuses new ones until `mend()`;
    `cut_during(pattern, n)` cuts `n` bytes into the request naming `pattern`; `stall_during(pattern)` holds that request; `delay` seconds are waited before each piece forwarded"""
    def __init__(self, port):
        self.target,self.port,self.delay,self.budget,self.conns,self.trigger,self.outage = port,free_port(),0.,None,[],None,None
        self.stall = None
        self.lock,self.listener = threading.Lock(),None
        self.mend()

    def mend(self):
        "Accept connections again"
        with self.lock:
            self.budget,self.trigger,self.outage,self.stall = None,None,None,None
            if self.listener is not None: return
            self.listener = socket.create_server(("127.0.0.1", self.port))
        threading.Thread(target=self._accept, args=(self.listener,), daemon=True).start()

    def cut(self):
        "Refuse new connections and drop the open ones, as a server that stopped"
        with self.lock:
            lst,self.listener,conns,self.conns,self.stall = self.listener,None,self.conns,[],None
        if lst is not None: _drop(lst) # wakes the thread waiting in `accept`
        for c in conns: _drop(c)

    def cut_during(self, pattern:bytes, n:int, mend_after:float|None=None):
        "Cut `n` bytes into the request whose head holds `pattern` (e.g. the name of the file being uploaded); mend later"
        with self.lock: self.trigger,self.outage = (pattern, n),mend_after

    def stall_during(self, pattern:bytes):
        "Hold the request whose head holds `pattern` until the link is cut, as a store that stopped answering it"
        with self.lock: self.stall = pattern

    def _accept(self, lst):
        while True:
            try: c,_ = lst.accept()
            except OSError: return # cut
            up = socket.create_connection(('127.0.0.1', self.target))
            with self.lock:
                if self.listener is not lst: # cut meanwhile
                    for s in (c, up): _drop(s)
                    return
                self.conns += [c, up]
            threading.Thread(target=self._pump, args=(c, up, True), daemon=True).start()
            threading.Thread(target=self._pump, args=(up, c, False), daemon=True).start()

    def _pump(self, src, dst, upward):
        try:
            while data := src.recv(1 << 16):
                if self.delay: time.sleep(self.delay)
                if upward and self.stall is not None and self.stall in data:
                    while self.stall is not None: time.sleep(0.05) # until `cut` or `mend`
                    return
                if upward and self.trigger is not None and self.trigger[0] in data:
                    with self.lock: self.budget,self.trigger = self.trigger[1],None
                if upward and self.budget is not None:
                    with self.lock: self.budget -= len(data)
                    if self.budget < 0:
                        if self.outage is not None: threading.Timer(self.outage, self.mend).start()
                        return self.cut()
                dst.sendall(data)
        except OSError: pass
        for s in (src, dst):
            try: s.shutdown(socket.SHUT_RDWR)
            except OSError: pass

def _drop(s):
    "End socket `s` at once: shut down both ways (what a forked process's copy of it can't delay), then closed"
    try: s.shutdown(socket.SHUT_RDWR)
    except OSError: pass
    s.close()

class S3Server:
    "moto's standalone S3 server on a free port, reached through a `FaultyLink`; `env` points boto/s3fs at it"
    def __init__(self):
        port = free_port()
        self.proc = subprocess.Popen([sys.executable, '-m', 'moto.server', '-H', '127.0.0.1', '-p', str(port)],
                                     stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        end = time.time() + 60
        while True:
            try: socket.create_connection(('127.0.0.1', port), timeout=1).close(); break
            except OSError:
                if time.time() > end or self.proc.poll() is not None: raise RuntimeError("moto's S3 server didn't start")
                time.sleep(0.1)
        self.link = FaultyLink(port)
        self.env = dict(AWS_ENDPOINT_URL=f'http://127.0.0.1:{self.link.port}', AWS_ACCESS_KEY_ID='testing',
                        AWS_SECRET_ACCESS_KEY='testing', AWS_DEFAULT_REGION='us-east-1')

    def stop(self):
        self.link.cut()
        self.proc.terminate()
        self.proc.wait(30)
