-- resident.client: one connection to residentd, written from libclient/PROTOCOL.md.
--
-- Frames are a 4-byte big-endian length and one msgpack map (vim.mpack). The
-- connection is opened on the first request, says hello, then sends what was
-- queued meanwhile; replies are routed to their request's handler by id. Every
-- handler runs on the main loop (vim.schedule), where buffers may be changed.
--
--   closed --request--> connecting --connected, hello sent--> hello --result--> ready
--      ^-------------- connect error, EOF, write error, a bad frame -------------/
--
-- When the connection fails, every request waiting on it gets an error reply
-- made here, with a code the daemon never sends: "connect" or "closed".
local uv = vim.loop

local M = {}

-- The protocol version this client speaks; hello refuses any other.
M.VERSION = 1

-- The default socket: the rules of libclient/socket_path.c.
function M.default_socket()
  local env = os.getenv('RESIDENT_SOCKET')
  if env ~= nil and env ~= '' then
    return env
  end
  local run = os.getenv('XDG_RUNTIME_DIR')
  if run ~= nil and run:sub(1, 1) == '/' then
    return run .. '/resident/socket'
  end
  return string.format('/tmp/resident-%d/socket', uv.getuid())
end

-- One frame: a 4-byte big-endian length, then the msgpack map.
local function frame(msg)
  local body = vim.mpack.encode(msg)
  local n = #body
  return string.char(math.floor(n / 16777216) % 256, math.floor(n / 65536) % 256,
    math.floor(n / 256) % 256, n % 256) .. body
end

local function be32(s)
  local a, b, c, d = s:byte(1, 4)
  return ((a * 256 + b) * 256 + c) * 256 + d
end

-- Replies that end their request.
local LAST = { result = true, done = true, error = true }

local Conn = {}
Conn.__index = Conn

-- A connection to the socket at path, opened by the first request.
function M.new(path, client_name)
  return setmetatable({
    path = path,
    client_name = client_name or 'nvim',
    state = 'closed',
    handlers = {}, -- id -> function(reply)
    queue = {}, -- frames waiting for the hello
    next_id = 1,
    buf = '',
  }, Conn)
end

-- Sends a request (a map without id); on_reply(reply) gets each of its
-- replies, the last one being a result, done or error. Returns the id.
function Conn:request(msg, on_reply)
  local id = self.next_id
  self.next_id = id + 1
  msg.id = id
  self.handlers[id] = on_reply
  table.insert(self.queue, frame(msg))
  if self.state == 'closed' then
    self:_connect()
  elseif self.state == 'ready' then
    self:_flush()
  end
  return id
end

-- Whether request id still waits for replies.
function Conn:pending(id)
  return self.handlers[id] ~= nil
end

-- Closes the connection; requests in flight get an error "closed".
function Conn:close()
  self:_fail('closed', 'the connection to residentd was closed')
end

function Conn:_connect()
  local pipe = uv.new_pipe(false)
  self.pipe = pipe
  self.state = 'connecting'
  self.buf = ''
  pipe:connect(self.path, vim.schedule_wrap(function(err)
    if self.pipe ~= pipe then
      return
    end
    if err ~= nil then
      return self:_fail('connect', M.connect_error(self.path, err))
    end
    self.state = 'hello'
    pipe:read_start(vim.schedule_wrap(function(rerr, chunk)
      if self.pipe == pipe then
        self:_on_read(rerr, chunk)
      end
    end))
    self:_hello()
  end))
end

-- The message for a failed connect, worded as libresident's.
function M.connect_error(path, err)
  if err:match('^ENOENT') then
    return string.format('residentd is not running (no socket at %s)', path)
  elseif err:match('^ECONNREFUSED') then
    return string.format('residentd is not running (nobody listens at %s)', path)
  end
  return string.format('cannot connect to %s: %s', path, err)
end

-- hello goes first; the queue is sent once the daemon's version is known.
function Conn:_hello()
  local id = self.next_id
  self.next_id = id + 1
  self.handlers[id] = function(r)
    if self.state ~= 'hello' then
      return -- the connection failed and fails every request itself
    end
    if r.type == 'error' then
      return self:_fail('closed', string.format('hello: %s: %s', r.code, r.message))
    end
    if r.version ~= M.VERSION then
      return self:_fail('closed', string.format('residentd speaks protocol version %s; this plugin speaks %d',
        tostring(r.version), M.VERSION))
    end
    self.server = r
    self.state = 'ready'
    self:_flush()
  end
  self:_write(frame({ id = id, op = 'hello', client = self.client_name, version = M.VERSION }))
end

function Conn:_flush()
  local q = self.queue
  self.queue = {}
  for _, f in ipairs(q) do
    self:_write(f)
  end
end

function Conn:_write(data)
  local pipe = self.pipe
  pipe:write(data, vim.schedule_wrap(function(err)
    if err ~= nil and self.pipe == pipe then
      self:_fail('closed', 'writing to residentd: ' .. err)
    end
  end))
end

-- Cuts the input into frames and hands each to its request's handler.
function Conn:_on_read(err, chunk)
  if err ~= nil or chunk == nil then
    return self:_fail('closed', err and ('reading from residentd: ' .. err) or 'residentd closed the connection')
  end
  self.buf = self.buf .. chunk
  while #self.buf >= 4 do
    local n = be32(self.buf)
    if #self.buf < 4 + n then
      return
    end
    local body = self.buf:sub(5, 4 + n)
    self.buf = self.buf:sub(5 + n)
    local ok, r = pcall(vim.mpack.decode, body)
    if not ok or type(r) ~= 'table' or type(r.type) ~= 'string' then
      return self:_fail('closed', 'residentd sent a frame that is not a reply: ' .. tostring(r))
    end
    self:_dispatch(r)
    if self.state == 'closed' then
      return
    end
  end
end

function Conn:_dispatch(r)
  local h = self.handlers[r.id]
  if h == nil then
    if r.type == 'error' then
      -- an error about no request of ours (id nil): a frame we sent was unreadable
      vim.notify(string.format('resident: %s: %s', tostring(r.code), tostring(r.message)), vim.log.levels.ERROR)
    end
    return
  end
  if LAST[r.type] then
    self.handlers[r.id] = nil
  end
  h(r)
end

-- Closes the pipe and ends every waiting request with an error.
function Conn:_fail(code, message)
  local handlers = self.handlers
  if self.pipe ~= nil and not self.pipe:is_closing() then
    self.pipe:close()
  end
  self.pipe = nil
  self.state = 'closed'
  self.handlers = {}
  self.queue = {}
  self.buf = ''
  local ids = vim.tbl_keys(handlers)
  table.sort(ids)
  for _, id in ipairs(ids) do
    handlers[id]({ id = id, type = 'error', code = code, message = message })
  end
end

return M
